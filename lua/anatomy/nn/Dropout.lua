-- nn.Dropout: zeroes elements with probability p while training.
-- A built-in block: LibTorch's C++ module (host/nn/blocks.cpp) under nn.Native.
local nn = require 'anatomy.nn'
local Native = nn.Native
local native = torch._native

-- nn.Dropout(p)
Native.define('Dropout', function(p) return native.Dropout(p or 0.5) end)

return nn.Dropout
