-- nn.ReLU(): max(x, 0). A built-in block (host/nn/blocks.cpp).
return require('anatomy.nn').Native.define('ReLU', function() return torch._native.Activation('relu') end)
