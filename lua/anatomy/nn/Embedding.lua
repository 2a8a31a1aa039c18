-- nn.Embedding: token ids (1-based) to vectors, plus a learned position table when asked.
-- A built-in block: LibTorch's C++ module (host/nn/blocks.cpp) under nn.Native.
local nn = require 'anatomy.nn'
local Native = nn.Native
local native = torch._native

-- nn.Embedding(n, dim, {positions = T}): 1-based int64 ids; a learned position table if positions is given
Native.define('Embedding', function(n, dim, opts)
  opts = Native.options(opts, {positions = true}, 'nn.Embedding')
  return native.Embedding(n, dim, opts.positions)
end)

return nn.Embedding
