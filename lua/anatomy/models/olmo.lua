-- models.Olmo2: AllenAI's OLMo 2 (model_type "olmo2") and OLMoE ("olmoe")
-- for models.from_pretrained, as the Llama adapter's settings and weights
-- with QK-norm over the whole q and k projections (nn.RoPEAttention's
-- qk_norm = 'proj'). OLMoE is a Llama block with nn.MoE as its MLP (top-k of
-- num_experts, the weights renormalised only with norm_topk_prob). OLMo 2
-- puts its norms after attention and MLP, x + norm(attn(x)), then +
-- norm(mlp(.)), with no norm before them: its own block here.
local nn = require('anatomy.nn')
local json = require('anatomy.io.json')
local models = require('anatomy.models')
local pretrained = require('anatomy.models.pretrained')
local llama = require('anatomy.models.llama')

local F = {}

function F.check(c, where)
  local s = llama.check(c, where)
  s.eps = c.rms_norm_eps or 1e-5
  s.qk_norm = 'proj'
  if c.model_type == 'olmo2' then
    s.norms = {'post_attention_layernorm', 'post_feedforward_layernorm'}
    return s
  end
  if c.clip_qkv ~= nil and c.clip_qkv ~= json.null then
    pretrained.refuse(where, 'clip_qkv', c.clip_qkv, 'anatomy does not clamp queries, keys and values')
  end
  -- OLMoE's q_norm is as wide as hidden_size and its k_norm as kv_heads * hidden_size / heads
  if s.head_dim and s.head_dim * s.heads ~= s.dim then
    pretrained.refuse(where, 'head_dim', s.head_dim, ("OLMoE's heads are hidden_size / num_attention_heads = %d wide"):format(math.floor(s.dim / s.heads)))
  end
  s.moe = llama.moe(c, where, 'num_experts', c.norm_topk_prob == true, llama.expert_names)
  return s
end

-- OLMo 2's block: no norm before attention or MLP; each one's output is
-- normed before it joins the stream. TransformerLens names those norms
-- ln1_post and ln2_post (its hook_attn_out and hook_mlp_out are their outputs).
local Block = nn.block('models.Olmo2Block', function(self, s)
  self.self_attn = nn.RoPEAttention(s.dim, s.heads, pretrained.attention_options(s.rope, {kv_heads = s.kv_heads,
    head_dim = s.head_dim, qkv_bias = s.qkv_bias, out_bias = s.out_bias, qk_norm = s.qk_norm, qk_norm_eps = s.eps}))
  self.post_attention_layernorm = nn.RMSNorm(s.dim, {eps = s.eps})
  self.mlp = nn.SwiGLU(s.dim, s.ffn)
  self.post_feedforward_layernorm = nn.RMSNorm(s.dim, {eps = s.eps})
end)
models.Olmo2Block = Block

Block.hook_names = pretrained.resid_hooks
Block.norm_roles = {ln1_post = 'post_attention_layernorm', ln2_post = 'post_feedforward_layernorm'}

-- block(x) -> x + norm(attn(x)), then + norm(mlp(.)), through the hook points
function Block:forward(x)
  x = self:hook('resid_pre', x)
  x = self:hook('resid_mid', x + self.post_attention_layernorm(self.self_attn(x)))
  return self:hook('resid_post', x + self.post_feedforward_layernorm(self.mlp(x)))
end

local Olmo2 = llama.model('models.Olmo2', Block)
Olmo2.extra_repr = models.Llama.extra_repr

-- OLMoE is models.Llama (its block with the attention's qk_norm and nn.MoE)
function F.build(s) return s.moe and llama.build(s) or Olmo2(s) end

F.size_keys, F.parameters, F.weights = llama.size_keys, llama.parameters, llama.weights
F.float_keys, F.ignored = llama.float_keys, llama.ignored

return F
