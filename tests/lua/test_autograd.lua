-- Autograd from Lua: gradients against hand-derived values, grad modes,
-- hooks, retain_grad, and the errors of misuse.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, close, raises = H.test, H.eq, H.close, H.raises

test('backward fills .grad of leaves', function()
  local x = torch.tensor({1, 2, 3}, {requires_grad = true})
  local y = (x * x * 3):sum()          -- dy/dx = 6x
  y:backward()
  close(x.grad, {6, 12, 18})
  eq(x.is_leaf, true)
  eq(y.is_leaf, false)
  eq(y.grad_fn, 'SumBackward0')
  -- gradients accumulate until cleared
  ;(x:sum()):backward()
  close(x.grad, {7, 13, 19})
  x:zero_grad()
  eq(x.grad, nil)
  x.grad = torch.zeros(3)
  x:zero_grad({set_to_none = false})
  close(x.grad, {0, 0, 0})
end)

test('a matmul chain matches the hand-derived gradient', function()
  torch.manual_seed(0)
  local a = torch.randn(3, 4, {dtype = 'float64', requires_grad = true})
  local b = torch.randn(4, 2, {dtype = 'float64', requires_grad = true})
  local loss = a:matmul(b):tanh():sum()
  loss:backward()
  local g = 1 - a:detach():matmul(b:detach()):tanh() ^ 2   -- d tanh
  close(a.grad, g:matmul(b:detach():t()), 1e-12)
  close(b.grad, a:detach():t():matmul(g), 1e-12)
end)

test('backward with an explicit gradient, retain_graph and create_graph', function()
  local x = torch.tensor({1, 2}, {requires_grad = true})
  local y = x * x
  y:backward(torch.tensor({1, 10}), {retain_graph = true})
  close(x.grad, {2, 40})
  y:backward(torch.tensor({1, 1}))
  close(x.grad, {4, 44})
  raises(function() y:backward(torch.tensor({1, 1})) end, 'if you need to access saved tensors after calling backward)')
  -- second derivative of x^3 is 6x
  local z = torch.tensor({2}, {requires_grad = true})
  local w = (z ^ 3):sum()
  w:backward({create_graph = true})
  local g = z.grad
  z.grad = nil
  g:sum():backward()
  close(z.grad, {12})
  raises(function() y:backward(torch.ones(3)) end, "bad argument #1 to 'backward' (gradient has shape 3, expected 2)")
  raises(function() y:backward() end, "calling 'backward' on bad self (backward() without a gradient needs a tensor with one element, got shape 2)")
end)

test('retain_grad keeps the gradient of an intermediate', function()
  local x = torch.tensor({1, 2}, {requires_grad = true})
  local h = x * 2
  h:retain_grad()
  ;(h * h):sum():backward()
  close(h.grad, {4, 8})
  close(x.grad, {8, 16})
end)

test('hooks see the gradient and may replace it', function()
  local x = torch.tensor({1, 2}, {requires_grad = true})
  local h = x * 3
  local seen
  local handle = h:register_hook(function(g) seen = g:clone(); return g * 0 end)
  ;(h * h):sum():backward()
  close(seen, {6, 12})
  close(x.grad, {0, 0})
  handle:remove()
  x.grad = nil
  local h2 = x * 3
  h2:register_hook(function(g) return nil end)
  ;(h2 * h2):sum():backward()
  close(x.grad, {18, 36})
  raises(function() torch.zeros(2):register_hook(print) end, "calling '_register_hook' on bad self (cannot register a hook on a tensor that does not require grad)")
  local bad = torch.ones(2, {requires_grad = true})
  bad:register_hook(function() return torch.ones(3) end)
  raises(function() (bad * 1):sum():backward() end, 'gradient hook returned shape 3, expected 2)')
end)

test('no_grad and enable_grad scope the grad mode and pass results back', function()
  local x = torch.ones(2, {requires_grad = true})
  local y, extra = torch.no_grad(function() return x * 2, 'ok' end)
  eq(y.requires_grad, false)
  eq(extra, 'ok')
  eq(torch.is_grad_enabled(), true)
  local ok = pcall(torch.no_grad, function() error('inside') end)
  eq(ok, false)
  eq(torch.is_grad_enabled(), true, 'restored after an error')
  torch.no_grad(function()
    local z = torch.enable_grad(function() return x * 2 end)
    eq(z.requires_grad, true)
  end)
  torch.set_grad_enabled(false)
  eq((x * 2).requires_grad, false)
  torch.set_grad_enabled(true)
end)

test('detach, clone and requires_grad', function()
  local x = torch.ones(2, {requires_grad = true})
  eq(x:detach().requires_grad, false)
  eq(x:clone().requires_grad, true)
  local y = torch.zeros(2)
  y.requires_grad = true
  eq(y.requires_grad, true)
  y:requires_grad_(false)
  eq(y.requires_grad, false)
  raises(function() torch.zeros(2, {dtype = 'int64'}):requires_grad_() end, "calling 'requires_grad_' on bad self (only floating-point tensors can require gradients)")
end)

-- Misuse accepted silently: x.grad took a tensor of another shape, or x itself.
test('x.grad takes a gradient of x\'s shape, dtype and device only', function()
  local w = torch.randn(3):requires_grad_()
  raises(function() w.grad = torch.randn(5) end, "bad argument #3 to '__newindex' (grad has shape 5, the tensor 3)")
  raises(function() w.grad = w end, "bad argument #3 to '__newindex' (a tensor cannot be its own grad)")
  local dev = w.device  -- the default device: cpu, accel or cuda
  raises(function() w.grad = torch.ones(3):double() end, "bad argument #3 to '__newindex' (grad is float64 on " .. dev .. ", the tensor float32 on " .. dev .. ")")
  if dev ~= 'cpu' then
    raises(function() w.grad = torch.ones(3, {device = 'cpu'}) end, "bad argument #3 to '__newindex' (grad is float32 on cpu, the tensor float32 on " .. dev .. ")")
  end
  w.grad = torch.ones(3)
  eq(w.grad:sum():item(), 3)
  w.grad = nil
  eq(w.grad, nil)
end)

H.done()
