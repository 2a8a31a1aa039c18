-- nn.MergeStreams(): (..., n, C) -> (..., C), the sum of the streams: closes
-- the widened residual stream that nn.ExpandStreams opened.
local nn = require('anatomy.nn')

local Merge = nn.class('nn.MergeStreams', nn.Module)
nn.MergeStreams = Merge

function Merge:__init() nn.Module.__init(self) end
-- (..., n, C) -> (..., C): the streams summed
function Merge:forward(x) return x:sum(-2) end

return Merge
