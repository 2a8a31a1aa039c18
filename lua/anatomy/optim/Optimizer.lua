-- What the optimizers written in Lua (optim.SGD, optim.Adam) share: the
-- parameter list they take, and zero_grad, lr and set_lr. optim.AdamW (over
-- LibTorch's) takes its parameters through Optimizer.params too.
local torch = require('anatomy.torch')
local nn = require('anatomy.nn')
local Optimizer = {}
Optimizer.__index = Optimizer

-- Optimizer.params(params, where, level) -> a module's parameters, or a table
-- of tensors that require grad; an error naming the optimizer otherwise.
function Optimizer.params(params, where, level)
  local list = nn.is_module(params) and params:parameters() or params
  if type(list) ~= 'table' then error(('%s: expected a module or a table of parameters, got %s'):format(where, nn.typename(params)), level + 1) end
  for i, p in ipairs(list) do
    if not torch.is_tensor(p) or not p.requires_grad then
      error(('%s: parameter %d is not a tensor that requires grad'):format(where, i), level + 1)
    end
  end
  if #list == 0 then error(('%s: no parameters to optimize'):format(where), level + 1) end
  return list
end

-- Optimizer.class() -> a class whose instances have Optimizer's methods
function Optimizer.class()
  local cls = setmetatable({}, {__index = Optimizer})
  cls.__index = cls
  return cls
end

function Optimizer:zero_grad() for _, p in ipairs(self.params) do p.grad = nil end end
function Optimizer:set_lr(lr) self.lr_ = lr end
function Optimizer:lr() return self.lr_ end

return Optimizer
