-- nn.Attention(dim, heads, {causal = true, bias = true}): multi-head
-- self-attention, children qkv and proj; m:keep_pattern(true) keeps its
-- attention matrix (B, H, T, T) for m:pattern(). A built-in block.
-- Hook points: q, k, v, z (B, T, H, D), scores and pattern (B, H, T, T), and
-- each head's output, result (B, T, H, C), computed only when asked for.
local nn = require('anatomy.nn')
local P, L = nn.point, nn.layouts
return nn.Native.define('Attention', {'dim', 'heads'}, {'causal', 'bias'}, {pattern = true, role = 'attention', declares = {
  P('q', L.heads, 'unfused'), P('k', L.heads, 'unfused'), P('v', L.heads, 'unfused'), P('scores', L.pattern, 'unfused'),
  P('pattern', L.pattern, 'unfused'), P('z', L.heads, 'unfused'), P('result', L.result, 'asked')}})
