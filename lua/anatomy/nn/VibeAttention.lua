-- nn.VibeAttention: VibeNet's parameter-free attention over the input itself.
-- A built-in block: LibTorch's C++ module (host/nn/blocks.cpp) under nn.Native.
local nn = require 'anatomy.nn'
local Native = nn.Native
local native = torch._native

-- nn.VibeAttention({causal = true}): softmax(mask(x xᵀ / √d)) x, no parameters
Native.define('VibeAttention', function(opts)
  opts = Native.options(opts, {causal = true}, 'nn.VibeAttention')
  return native.VibeAttention(opts.causal ~= false)
end)

for k, f in pairs(Native.pattern_methods) do nn.VibeAttention[k] = f end

return nn.VibeAttention
