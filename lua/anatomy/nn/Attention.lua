-- nn.Attention: multi-head self-attention with learned q, k, v and output projections.
-- A built-in block: LibTorch's C++ module (host/nn/blocks.cpp) under nn.Native.
local nn = require 'anatomy.nn'
local Native = nn.Native
local native = torch._native

-- nn.Attention(dim, heads, {causal = true, bias = true}): children qkv and proj
Native.define('Attention', function(dim, heads, opts)
  opts = Native.options(opts, {causal = true, bias = true}, 'nn.Attention')
  return native.Attention(dim, heads, opts.causal ~= false, opts.bias ~= false)
end)

for k, f in pairs(Native.pattern_methods) do nn.Attention[k] = f end

return nn.Attention
