-- optim.Adam(params, {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8,
-- weight_decay = 0}): Adam as torch.optim.Adam defines it, weight decay
-- added to the gradient (L2; optim.AdamW decouples it):
--   g = grad + weight_decay p;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g²
--   p = p - lr / (1 - b1^t) · m / (√v / √(1 - b2^t) + eps)
local torch = require('anatomy.torch')
local Optimizer = require('anatomy.optim.Optimizer')
local options = require('anatomy.torch.options')

local Adam = Optimizer.class()

getmetatable(Adam).__call = function(_, params, opts)
  opts = options.check(opts, {lr = true, betas = true, eps = true, weight_decay = true}, 'optim.Adam', 2)
  local betas = opts.betas or {0.9, 0.999}
  if not (betas[1] >= 0 and betas[1] < 1 and betas[2] >= 0 and betas[2] < 1) then error('optim.Adam: betas must be in [0, 1)', 2) end
  return setmetatable({params = Optimizer.params(params, 'optim.Adam', 2), lr_ = opts.lr or 1e-3, beta1 = betas[1], beta2 = betas[2],
    eps = opts.eps or 1e-8, weight_decay = opts.weight_decay or 0, state = {}}, Adam)
end

-- opt:step(): one update of every parameter from its gradient
function Adam:step()
  torch.no_grad(function()
    for i, p in ipairs(self.params) do
      local g = p.grad
      if g ~= nil then
        if self.weight_decay ~= 0 then g = g + p * self.weight_decay end
        local s = self.state[i]
        if s == nil then
          s = {step = 0, exp_avg = torch.zeros_like(p), exp_avg_sq = torch.zeros_like(p)}
          self.state[i] = s
        end
        s.step = s.step + 1
        s.exp_avg:mul_(self.beta1):add_(g * (1 - self.beta1))
        s.exp_avg_sq:mul_(self.beta2):add_(g * g * (1 - self.beta2))
        local bias1, bias2 = 1 - self.beta1 ^ s.step, 1 - self.beta2 ^ s.step
        local denom = s.exp_avg_sq:sqrt() / math.sqrt(bias2) + self.eps
        p:add_(s.exp_avg / denom * (-self.lr_ / bias1))
      end
    end
  end)
end


return Adam
