-- nn.Embedding(n, dim, {positions = T}): token ids (1-based int64) to vectors,
-- plus a learned position table when positions is given. A built-in block.
return require('anatomy.nn').Native.define('Embedding', {'num_embeddings', 'embedding_dim'}, {'positions'})
