-- nn.Linear: a learned affine map, y = x Wᵀ + b (weight [out, in], as PyTorch).
-- A built-in block: LibTorch's C++ module (host/nn/blocks.cpp) under nn.Native.
local nn = require 'anatomy.nn'
local Native = nn.Native
local native = torch._native

-- nn.Linear(in, out, {bias = true})
Native.define('Linear', function(i, o, opts)
  opts = Native.options(opts, {bias = true}, 'nn.Linear')
  return native.Linear(i, o, opts.bias ~= false)
end)

return nn.Linear
