-- nn.Gate(f, dim): gate(x) + f(x), the identity replaced by a learnable
-- Linear(dim, dim) gate, so gradient to earlier layers passes through it.
local nn = require('anatomy.nn')

local Gate = nn.class('nn.Gate', nn.Module)
nn.Gate = Gate
-- The residual-wrapper protocol (the autopsy reads it): the child that
-- computes f, whose output zeroed leaves the wrapper's own path, gate(x);
-- and the child that replaces the identity, whose output replaced by its
-- input puts the identity back.
Gate.residual_branch = 'inner'
Gate.skip_module = 'gate'

function Gate:__init(inner, dim)
  nn.Module.__init(self)
  nn.check_forward(inner, 'nn.Gate: inner', 3)
  if type(dim) ~= 'number' then error('nn.Gate(f, dim): dim must be a number', 3) end
  self.gate = nn.Linear(dim, dim)
  self.inner = inner
end

-- gate(x) + f(x)
function Gate:forward(x)
  return nn.call_child(self, 'gate', self.gate, x) + nn.call_child(self, 'inner', self.inner, x)
end

return Gate
