-- nn.LayerNorm: normalises each vector to zero mean and unit variance, then scales and shifts.
-- A built-in block: LibTorch's C++ module (host/nn/blocks.cpp) under nn.Native.
local nn = require 'anatomy.nn'
local Native = nn.Native
local native = torch._native

-- nn.LayerNorm(dim, {eps = 1e-5})
Native.define('LayerNorm', function(dim, opts)
  opts = Native.options(opts, {eps = true}, 'nn.LayerNorm')
  return native.LayerNorm(dim, opts.eps or 1e-5)
end)

return nn.LayerNorm
