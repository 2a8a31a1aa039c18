-- nn.VibeAttention({causal = true}): VibeNet's parameter-free attention,
-- softmax(mask(x xᵀ / √d)) x; keeps its pattern like nn.Attention. A built-in block.
-- Hook points: scores and pattern (B, 1, T, T), z (B, T, 1, C).
local nn = require('anatomy.nn')
local P, L = nn.point, nn.layouts
return nn.Native.define('VibeAttention', {}, {'causal'}, {pattern = true, heads = 1, role = 'attention', declares = {
  P('scores', L.pattern, 'unfused'), P('pattern', L.pattern, 'unfused'), P('z', L.heads, 'unfused')}})
