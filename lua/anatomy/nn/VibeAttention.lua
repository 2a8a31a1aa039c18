-- nn.VibeAttention({causal = true}): VibeNet's parameter-free attention,
-- softmax(mask(x xᵀ / √d)) x; keeps its pattern like nn.Attention. A built-in block.
return require('anatomy.nn').Native.define('VibeAttention', {}, {'causal'}, {pattern = true, heads = 1})
