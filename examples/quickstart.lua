-- Quickstart: tensors, broadcasting, a matmul and a backward pass, as a first
-- look at anatomy's torch. Indices and dims count from 1, as everywhere in Lua.
--   anatomy examples/quickstart.lua
torch.manual_seed(0)

local function section(title) print(('\n== %s '):format(title) .. ('='):rep(60 - #title)) end

section('tensors')
local x = torch.tensor({{1, 2, 3}, {4, 5, 6}})      -- 2x3, float32 by default
print(x)
print('shape', table.concat(x:size(), 'x'), 'dtype', x.dtype, 'device', x.device)
print('x[2][3] =', x[2][3]:item(), '  last row:', x[-1])
print('a 2x2 corner, Torch7-style:', x[{{1, 2}, {2, 3}}])

section('broadcasting')
local row = torch.tensor({10, 20, 30})               -- shape 3 against 2x3
print(x + row)
print(x * 2 - 1)
print('mean over dim 2 (rows):', x:mean(2))

section('a matmul')
local w = torch.randn(3, 4)
local y = x:matmul(w)                                 -- (2, 3) @ (3, 4) -> (2, 4)
print(y)
print('argmax of each row (1-based):', y:argmax(2))

section('autograd')
-- A two-parameter least-squares fit: loss = mean((a * t + b - target)^2)
local t = torch.linspace(0, 1, 8)
local target = 3 * t + 0.5
local a = torch.zeros(1, {requires_grad = true})
local b = torch.zeros(1, {requires_grad = true})
local loss = ((a * t + b - target) ^ 2):mean()
loss:backward()
print('loss', loss:item())
print('d loss / d a =', a.grad:item(), '  d loss / d b =', b.grad:item())
-- The same gradients by hand: dL/da = mean(2 (a t + b - target) t) at a = b = 0
local by_hand = (2 * (-target) * t):mean():item()
print(('by hand: %.6f  (difference %.2e)'):format(by_hand, math.abs(by_hand - a.grad:item())))

section('a few steps of gradient descent')
for step = 1, 200 do
  local l = ((a * t + b - target) ^ 2):mean()
  a.grad, b.grad = nil, nil
  l:backward()
  torch.no_grad(function()
    a:sub_(a.grad * 0.5)
    b:sub_(b.grad * 0.5)
  end)
  if step % 50 == 0 then print(('step %3d  loss %.6f  a %.4f  b %.4f'):format(step, l:item(), a:item(), b:item())) end
end
print('fitted a and b approach 3 and 0.5')
