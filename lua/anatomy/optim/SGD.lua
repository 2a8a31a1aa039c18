-- optim.SGD(params, {lr, momentum = 0, dampening = 0, weight_decay = 0,
-- nesterov = false}): stochastic gradient descent with momentum, as
-- torch.optim.SGD defines it:
--   g = grad + weight_decay p;  buf = g (first step), else momentum buf + (1 - dampening) g
--   g = g + momentum buf (nesterov) or buf;  p = p - lr g
local torch = require('anatomy.torch')
local Optimizer = require('anatomy.optim.Optimizer')
local options = require('anatomy.torch.options')

local SGD = Optimizer.class()

getmetatable(SGD).__call = function(_, params, opts)
  opts = options.check(opts, {lr = true, momentum = true, dampening = true, weight_decay = true,
    nesterov = true}, 'optim.SGD', 2)
  if type(opts.lr) ~= 'number' or opts.lr < 0 then error('optim.SGD: lr must be a non-negative number (there is no default)', 2) end
  local self = setmetatable({params = Optimizer.params(params, 'optim.SGD', 2), lr_ = opts.lr, momentum = opts.momentum or 0,
    dampening = opts.dampening or 0, weight_decay = opts.weight_decay or 0, nesterov = opts.nesterov == true, buffers = {}}, SGD)
  if self.nesterov and (self.momentum <= 0 or self.dampening ~= 0) then
    error('optim.SGD: nesterov needs momentum > 0 and dampening 0', 2)
  end
  return self
end

-- opt:step(): one update of every parameter from its gradient
function SGD:step()
  torch.no_grad(function()
    for i, p in ipairs(self.params) do
      local g = p.grad
      if g ~= nil then
        if self.weight_decay ~= 0 then g = g + p * self.weight_decay end
        if self.momentum ~= 0 then
          local buf = self.buffers[i]
          if buf == nil then
            buf = g:clone()
            self.buffers[i] = buf
          else
            buf:mul_(self.momentum):add_(g * (1 - self.dampening))
          end
          g = self.nesterov and g + buf * self.momentum or buf
        end
        p:add_(g * -self.lr_)
      end
    end
  end)
end


return SGD
