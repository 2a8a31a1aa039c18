-- nn.Sequential{m1, m2, ...}: runs its children in order; children are
-- named 1, 2, ... An error names the block it came from.
local nn = require 'anatomy.nn'

local Sequential = nn.class('nn.Sequential', nn.Module)
nn.Sequential = Sequential

function Sequential:__init(list)
  nn.Module.__init(self)
  for i, m in ipairs(list or {}) do
    if not nn.is_module(m) then
      error(('nn.Sequential: entry %d is %s, not a module'):format(i, nn.typename(m)), 3)
    end
    self:add_module(tostring(i), m)
  end
end

-- seq:add(m): appends a child.
function Sequential:add(m)
  return self:add_module(tostring(#self._children + 1), m)
end

function Sequential:forward(x)
  for name, child in self:named_children() do x = nn.call_child(self, name, child, x) end
  return x
end

return Sequential
