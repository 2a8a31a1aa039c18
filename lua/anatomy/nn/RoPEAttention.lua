-- nn.RoPEAttention(dim, heads, {kv_heads = heads, head_dim = dim / heads,
--   rotary_dim = head_dim, theta = 10000, scaling = 'default'|'linear'|'llama3',
--   factor, low_freq_factor, high_freq_factor, original_max_positions,
--   qkv_bias = false, out_bias = false, causal = true, sliding_window = 0,
--   scale = 1/sqrt(head_dim), softcap, qk_norm = 'none'|'head'|'proj', qk_norm_eps = 1e-6,
--   qk_norm_offset = 0, interleaved = false, short_factor, long_factor, attention_factor = 1}):
-- self-attention with rotary position embeddings, as Llama, Mistral, Qwen2
-- and GPT-NeoX use it. Children q, k, v, o; kv_heads < heads shares keys and
-- values across groups of query heads (1: multi-query); rotary_dim < head_dim
-- rotates only the leading dims (GPT-NeoX's rotary_pct); sliding_window
-- limits how far back a position sees (Mistral). scale replaces the scores'
-- 1/sqrt(head_dim) (Gemma's query_pre_attn_scalar^-1/2); softcap soft-caps
-- them, softcap * tanh(scores / softcap), before the mask (Gemma 2). qk_norm
-- adds RMSNorms q_norm and k_norm (eps qk_norm_eps, offset qk_norm_offset as
-- nn.RMSNorm's) on the projected queries and keys before rotation: over each
-- head's dims ('head': Qwen3, Gemma 3) or over the whole projection ('proj':
-- OLMo 2, OLMoE). interleaved rotates the pairs (2i, 2i+1) (GPT-J) rather
-- than (i, i + rotary_dim/2). scaling = 'longrope' (Phi-3) divides the
-- frequencies by short_factor, or by long_factor in a forward whose last
-- position is past original_max_positions (rotary_dim/2 numbers each), and
-- multiplies cos and sin by attention_factor. Publishes its pattern
-- (B, H, T, T) like nn.Attention. A built-in block. Hook points: nn.Attention's,
-- with qk_norm the normed queries and keys before rotation, q_normed and k_normed
-- (B, T, H, D; TransformerLens's hook_q_normed, hook_k_normed), and the rotated
-- ones, rot_q and rot_k (B, T, H, D).
local nn = require('anatomy.nn')
local P, L = nn.point, nn.layouts
return nn.Native.define('RoPEAttention', {'dim', 'heads'},
  {'kv_heads', 'head_dim', 'rotary_dim', 'theta', 'scaling', 'factor', 'low_freq_factor', 'high_freq_factor',
   'original_max_positions', 'qkv_bias', 'out_bias', 'causal', 'sliding_window', 'scale', 'softcap', 'qk_norm',
   'qk_norm_eps', 'qk_norm_offset', 'interleaved', 'short_factor', 'long_factor', 'attention_factor'}, {pattern = true, role = 'attention', declares = {
  P('q', L.heads, 'unfused'), P('k', L.heads, 'unfused'), P('v', L.heads, 'unfused'), P('q_normed', L.heads, 'unfused'),
  P('k_normed', L.heads, 'unfused'), P('rot_q', L.heads, 'unfused'),
  P('rot_k', L.heads, 'unfused'), P('scores', L.pattern, 'unfused'), P('pattern', L.pattern, 'unfused'),
  P('z', L.heads, 'unfused'), P('result', L.result, 'asked')}})
