-- nn.ExpandStreams(n): (..., C) -> (..., n, C), n copies of the stream: opens
-- the widened residual stream that nn.HyperConnections blocks mix.
local nn = require('anatomy.nn')

local Expand = nn.class('nn.ExpandStreams', nn.Module)
nn.ExpandStreams = Expand

function Expand:__init(n)
  nn.Module.__init(self)
  rawset(self, 'streams', n)
end

-- (..., C) -> (..., n, C): n copies of the stream
function Expand:forward(x)
  local size = x:size()
  table.insert(size, #size, self.streams)
  return x:unsqueeze(-2):expand(size)
end

-- The number of streams, as print(model) shows it
function Expand:extra_repr() return tostring(self.streams) end

return Expand
