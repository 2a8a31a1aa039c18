-- nn.GELU({approximate = 'none'|'tanh'}): the Gaussian error linear unit,
-- exact or with the tanh approximation. A built-in block (host/nn/blocks.cpp).
local native = require('anatomy.torch.native')
local Native = require('anatomy.nn').Native

return Native.define('GELU', function(opts)
  opts = Native.options(opts, {approximate = true}, 'nn.GELU')
  local a = opts.approximate or 'none'
  if a ~= 'none' and a ~= 'tanh' then error(("nn.GELU: approximate must be 'none' or 'tanh', got '%s'"):format(tostring(a)), 4) end
  return native.blocks.Activation(a == 'tanh' and 'gelu_tanh' or 'gelu')
end)
