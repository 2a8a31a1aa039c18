-- nn.Attention(dim, heads, {causal = true, bias = true}): multi-head
-- self-attention, children qkv and proj; m:keep_pattern(true) keeps its
-- attention matrix (B, H, T, T) for m:pattern(). A built-in block.
return require('anatomy.nn').Native.define('Attention', {'dim', 'heads'}, {'causal', 'bias'}, {pattern = true})
