-- nn.MLP: two Linear maps around an activation (the transformer feed-forward block).
-- A built-in block: LibTorch's C++ module (host/nn/blocks.cpp) under nn.Native.
local nn = require 'anatomy.nn'
local Native = nn.Native
local native = torch._native

-- nn.MLP(dim, hidden, {activation = 'gelu'|'gelu_tanh'|'relu', bias = true}): children fc and proj
Native.define('MLP', function(dim, hidden, opts)
  opts = Native.options(opts, {activation = true, bias = true}, 'nn.MLP')
  return native.MLP(dim, hidden, opts.activation or 'gelu', opts.bias ~= false)
end)

return nn.MLP
