-- nn.LayerNorm(dim, {eps = 1e-5}): each vector to zero mean and unit
-- variance, then a learned scale and shift. A built-in block.
return require('anatomy.nn').Native.define('LayerNorm', {'dim'}, {'eps'})
