-- nn.RoPEAttention(dim, heads, {kv_heads = heads, head_dim = dim / heads,
--   rotary_dim = head_dim, theta = 10000, scaling = 'default'|'linear'|'llama3',
--   factor, low_freq_factor, high_freq_factor, original_max_positions,
--   qkv_bias = false, out_bias = false, causal = true, sliding_window = 0}):
-- self-attention with rotary position embeddings, as Llama, Mistral, Qwen2
-- and GPT-NeoX use it. Children q, k, v, o; kv_heads < heads shares keys and
-- values across groups of query heads (1: multi-query); rotary_dim < head_dim
-- rotates only the leading dims (GPT-NeoX's rotary_pct); sliding_window
-- limits how far back a position sees (Mistral). Publishes its pattern
-- (B, H, T, T) like nn.Attention. A built-in block. Hook points: nn.Attention's
-- and the rotated queries and keys, rot_q and rot_k (B, T, H, D).
local nn = require('anatomy.nn')
local P, L = nn.point, nn.layouts
return nn.Native.define('RoPEAttention', {'dim', 'heads'},
  {'kv_heads', 'head_dim', 'rotary_dim', 'theta', 'scaling', 'factor', 'low_freq_factor', 'high_freq_factor',
   'original_max_positions', 'qkv_bias', 'out_bias', 'causal', 'sliding_window'}, {pattern = true, role = 'attention', declares = {
  P('q', L.heads, 'unfused'), P('k', L.heads, 'unfused'), P('v', L.heads, 'unfused'), P('rot_q', L.heads, 'unfused'),
  P('rot_k', L.heads, 'unfused'), P('scores', L.pattern, 'unfused'), P('pattern', L.pattern, 'unfused'),
  P('z', L.heads, 'unfused'), P('result', L.result, 'asked')}})
