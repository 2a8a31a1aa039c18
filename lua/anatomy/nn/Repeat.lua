-- nn.Repeat(n, factory): n blocks made by factory(i), run in order; named 1..n.
local nn = require('anatomy.nn')

local Repeat = nn.class('nn.Repeat', nn.Sequential)
nn.Repeat = Repeat

function Repeat:__init(n, factory)
  nn.Module.__init(self)
  if type(n) ~= 'number' or n < 0 or n % 1 ~= 0 then error('nn.Repeat: n must be a non-negative integer', 3) end
  if type(factory) ~= 'function' then error('nn.Repeat: factory must be a function returning a module', 3) end
  rawset(self, 'n', n)
  for i = 1, n do
    local m = factory(i)
    nn.check_forward(m, ("nn.Repeat: factory(%d)'s result"):format(i), 3)
    self:add_module(tostring(i), m)
  end
end

-- The number of copies, as print(model) shows it
function Repeat:extra_repr() return tostring(self.n) end

return Repeat
