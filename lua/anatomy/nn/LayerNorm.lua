-- nn.LayerNorm(dim, {eps = 1e-5}): each vector to zero mean and unit
-- variance, then a learned scale and shift. A built-in block. Hook points:
-- the divisor, scale (B, T, 1), and the normalized vectors before the weight.
local nn = require('anatomy.nn')
return nn.Native.define('LayerNorm', {'dim'}, {'eps'}, {role = 'norm',
  declares = {nn.point('scale', nn.layouts.scale, 'unfused'), nn.point('normalized', nn.layouts.stream, 'unfused')}})
