-- nn.Dropout(p = 0.5): zeroes elements with probability p while training
-- (and scales the rest by 1/(1-p)). A built-in block (host/nn/blocks.cpp).
local native = require('anatomy.torch.native')
return require('anatomy.nn').Native.define('Dropout', function(p) return native.blocks.Dropout(p or 0.5) end)
