-- nn.Dropout(p = 0.5): zeroes elements with probability p while training
-- (and scales the rest by 1/(1-p)). A built-in block (host/nn/blocks.cpp).
return require('anatomy.nn').Native.define('Dropout', function(p) return torch._native.Dropout(p or 0.5) end)
