-- nn.block(name, init): a block class written in Lua. init(self, ...) assigns
-- children and parameters as fields; define Class:forward(x) from tensor ops.
--   local Gate = nn.block('Gate', function(self, dim, inner)
--     self.gate = nn.Linear(dim, dim); self.inner = inner
--   end)
--   function Gate:forward(x) return self.gate(x) + self.inner(x) end
local nn = require('anatomy.nn')

-- nn.block(name, init[, parent]) -> a class: init(self, ...) makes the children and parameters as
-- fields; define Class:forward(x). The file's header has an example
function nn.block(name, init, parent)
  assert(type(name) == 'string', 'nn.block: the first argument is the class name')
  assert(type(init) == 'function', 'nn.block: the second argument is the init function')
  local cls = nn.class(name, parent or nn.Module)
  function cls:__init(...)
    nn.Module.__init(self)
    init(self, ...)
  end
  return cls
end

return nn.block
