-- nn.GELU: the Gaussian error linear unit, exact or with the tanh approximation.
-- A built-in block: LibTorch's C++ module (host/nn/blocks.cpp) under nn.Native.
local nn = require 'anatomy.nn'
local Native = nn.Native
local native = torch._native

-- nn.GELU({approximate = 'none'|'tanh'})
Native.define('GELU', function(opts)
  opts = Native.options(opts, {approximate = true}, 'nn.GELU')
  local a = opts.approximate or 'none'
  if a ~= 'none' and a ~= 'tanh' then error(("nn.GELU: approximate must be 'none' or 'tanh', got '%s'"):format(tostring(a)), 4) end
  return native.Activation(a == 'tanh' and 'gelu_tanh' or 'gelu')
end)

return nn.GELU
