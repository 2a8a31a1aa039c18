-- SGD (momentum, Nesterov, weight decay) and Adam (L2 weight decay) with an
-- LR scheduler, on the tensors test_optim_parity.py wrote: five steps of
-- loss = mean((tanh(X W + b) - Y)²) each; writes the losses and parameters.
--   anatomy optim_parity.lua INPUT.safetensors OUTPUT.safetensors
local input, output = arg[1], arg[2]
local t = torch.load_safetensors(input)
local out = {}
local settings = {
  sgd = function(ps) return optim.SGD(ps, {lr = 0.1, momentum = 0.9, weight_decay = 0.01}) end,
  nesterov = function(ps) return optim.SGD(ps, {lr = 0.1, momentum = 0.9, nesterov = true}) end,
  adam = function(ps) return optim.Adam(ps, {lr = 0.05, betas = {0.8, 0.99}, weight_decay = 0.1}) end,
}
for _, name in ipairs{'sgd', 'nesterov', 'adam'} do
  local W, b = t.W:clone():requires_grad_(), t.b:clone():requires_grad_()
  local opt = settings[name]({W, b})
  local sched = optim.lr_scheduler(opt, {schedule = 'cosine', steps = 5, warmup = 2})
  for step = 1, 5 do
    opt:zero_grad()
    local loss = ((t.X:matmul(W) + b):tanh() - t.Y):pow(2):mean()
    loss:backward()
    opt:step()
    sched:step()
    out[('%s.loss.%d'):format(name, step)] = loss:detach()
  end
  out[name .. '.W'], out[name .. '.b'] = W:detach(), b:detach()
end
torch.save_safetensors(output, out)
