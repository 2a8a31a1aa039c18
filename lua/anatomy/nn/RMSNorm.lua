-- nn.RMSNorm: divides each vector by its root mean square, then scales it.
-- A built-in block: LibTorch's C++ module (host/nn/blocks.cpp) under nn.Native.
local nn = require 'anatomy.nn'
local Native = nn.Native
local native = torch._native

-- nn.RMSNorm(dim, {eps = 1e-6}): learnable weight
Native.define('RMSNorm', function(dim, opts)
  opts = Native.options(opts, {eps = true}, 'nn.RMSNorm')
  return native.RMSNorm(dim, opts.eps or 1e-6)
end)

return nn.RMSNorm
