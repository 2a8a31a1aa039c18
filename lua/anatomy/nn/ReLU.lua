-- nn.ReLU: max(x, 0).
-- A built-in block: LibTorch's C++ module (host/nn/blocks.cpp) under nn.Native.
local nn = require 'anatomy.nn'
local Native = nn.Native
local native = torch._native

-- nn.ReLU()
Native.define('ReLU', function() return native.Activation('relu') end)

return nn.ReLU
