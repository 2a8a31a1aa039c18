-- nn.RMSNorm(dim, {eps = 1e-6, offset = 0}): each vector divided by its root
-- mean square, then a learned scale, weight + offset (Gemma's norms: offset
-- 1, their checkpoints holding the scale minus one; weight starts at 1 - offset). A built-in block. Hook points as
-- nn.LayerNorm's: scale (B, T, 1) and normalized.
local nn = require('anatomy.nn')
return nn.Native.define('RMSNorm', {'dim'}, {'eps', 'offset'}, {role = 'norm',
  declares = {nn.point('scale', nn.layouts.scale, 'unfused'), nn.point('normalized', nn.layouts.stream, 'unfused')}})
