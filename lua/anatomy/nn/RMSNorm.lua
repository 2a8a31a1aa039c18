-- nn.RMSNorm(dim, {eps = 1e-6}): each vector divided by its root mean
-- square, then a learned scale. A built-in block.
return require('anatomy.nn').Native.define('RMSNorm', {'dim'}, {'eps'})
