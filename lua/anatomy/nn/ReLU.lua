-- nn.ReLU(): max(x, 0). A built-in block (host/nn/blocks.cpp).
local native = require('anatomy.torch.native')
return require('anatomy.nn').Native.define('ReLU', function() return native.blocks.Activation('relu') end)
