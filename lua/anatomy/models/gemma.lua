-- models.Gemma: Hugging Face's Gemma family (model_type "gemma": Gemma 1;
-- "gemma2"; "gemma3_text": Gemma 3's text model, Gemma3ForCausalLM) in the
-- library's blocks, for models.from_pretrained. Token embeddings scaled by
-- √hidden_size; RMSNorms that scale by 1 + weight (nn.RMSNorm offset 1);
-- nn.RoPEAttention scaled by query_pre_attn_scalar^-1/2, with Gemma 2's
-- attention-logit soft-capping, Gemma 3's per-head QK-norm, and sliding-window
-- layers (config.layer_types) with Gemma 3's local RoPE base; the GeGLU MLP
-- (nn.SwiGLU with gelu_tanh); Gemma 2 and 3 wrap attention and MLP each in a
-- norm before and after; the final logits soft-capped; the head tied or not.
-- Names follow Hugging Face's, except the stack: blocks.1 is model.layers.0.
-- "gemma3" (Gemma3ForConditionalGeneration: gemma-3-4b/12b/27b) loads its
-- language model alone, from text_config, as transformers runs it on text.
local torch = require('anatomy.torch')
local nn = require('anatomy.nn')
local models = require('anatomy.models')
local json = require('anatomy.io.json')
local pretrained = require('anatomy.models.pretrained')

local F = {}

-- config.json's `key`: transformers' default when absent, nil when null
local function setting(c, key, default)
  local v = c[key]
  if v == nil then return default end
  if v == json.null then return nil end
  return v
end

-- Which layers slide: config.layer_types, else transformers' pattern (Gemma 2
-- alternates from a sliding first layer; Gemma 3 slides all but every
-- sliding_window_pattern-th, 6 unless set). Gemma 1 has no sliding layers.
local function layer_types(c, s, where)
  if s.family == 'gemma' then return nil end
  local types = setting(c, 'layer_types')
  if types == nil then
    local every = s.family == 'gemma2' and 2 or setting(c, 'sliding_window_pattern', 6)
    types = {}
    for i = 1, s.layers do types[i] = i % every ~= 0 and 'sliding_attention' or 'full_attention' end
  end
  if type(types) ~= 'table' or #types ~= s.layers then
    pretrained.refuse(where, 'layer_types', types, ('one per layer, %d of them'):format(s.layers))
  end
  for _, t in ipairs(types) do
    if t ~= 'sliding_attention' and t ~= 'full_attention' then
      pretrained.refuse(where, 'layer_types', types, 'each sliding_attention or full_attention')
    end
  end
  return types
end

-- Gemma 3's RoPE for global and for sliding layers: transformers 5's
-- rope_parameters per layer type, or the Hub's rope_theta (1e6) and
-- rope_scaling for the global ones and rope_local_base_freq (1e4) for the others.
local function gemma3_rope(c, where)
  local p = type(c.rope_parameters) == 'table' and c.rope_parameters or {}
  local function typed(q, theta)
    local merged = {rope_theta = theta}
    if type(q) == 'table' then for k, v in pairs(q) do merged[k] = v end end
    return pretrained.rope({rope_parameters = merged}, where)
  end
  if p.full_attention ~= nil or p.sliding_attention ~= nil then
    return typed(p.full_attention, 1e6), typed(p.sliding_attention, 1e4)
  end
  local global = pretrained.rope({rope_theta = setting(c, 'rope_theta', 1e6), rope_scaling = c.rope_scaling,
    rope_parameters = c.rope_parameters}, where)
  return global, {theta = setting(c, 'rope_local_base_freq', 1e4), scaling = 'default', partial = 1}
end

-- Gemma 3's multimodal config (model_type gemma3): its language model's settings are text_config's, with
-- Gemma3TextConfig's defaults for the keys the Hub's files leave out, and the head tied by the top level's
-- tie_word_embeddings (text_config's is not read), as transformers' Gemma3ForConditionalGeneration
local text_defaults = {vocab_size = 262208, hidden_size = 2304, intermediate_size = 9216, num_hidden_layers = 26,
  num_attention_heads = 8, num_key_value_heads = 4, head_dim = 256, max_position_embeddings = 131072}
local function text_config(c, where)
  local t = c.text_config
  if type(t) ~= 'table' or t == json.null then
    pretrained.refuse(where, 'text_config', t == nil and json.null or t, "model_type gemma3 keeps its language model's settings there")
  end
  if t.model_type ~= nil and t.model_type ~= 'gemma3_text' then
    pretrained.refuse(where, 'text_config.model_type', t.model_type, 'a Gemma 3 language model is gemma3_text')
  end
  local text = {}
  for k, v in pairs(text_defaults) do text[k] = v end
  for k, v in pairs(t) do text[k] = v end
  text.model_type, text.tie_word_embeddings = 'gemma3_text', setting(c, 'tie_word_embeddings', true)
  return text
end

local activations = {gelu_pytorch_tanh = 'gelu_tanh', gelu_new = 'gelu_tanh', gelu = 'gelu', silu = 'silu'}

function F.check(c, where)
  local multimodal = c.model_type == 'gemma3'
  if multimodal then c = text_config(c, where) end
  local function dim(key, optional) return pretrained.dim(c, key, where, optional) end
  local s = {
    family = c.model_type, vocab = dim('vocab_size'), dim = dim('hidden_size'), ffn = dim('intermediate_size'),
    layers = dim('num_hidden_layers'), heads = dim('num_attention_heads'), eps = setting(c, 'rms_norm_eps', 1e-6),
    tied = setting(c, 'tie_word_embeddings', true) == true, positions = dim('max_position_embeddings', true),
    bias = c.attention_bias == true, sandwich = c.model_type ~= 'gemma', qk_norm = c.model_type == 'gemma3_text',
  }
  s.kv_heads = dim('num_key_value_heads', true) or s.heads
  s.head_dim = dim('head_dim', true) or 256  -- transformers' default, whatever the width
  -- Gemma 1 names its activation hidden_act (its legacy 'gelu' meaning the tanh one, as transformers
  -- rewrites it); Gemma 2 and 3 hidden_activation
  local key = s.sandwich and 'hidden_activation' or 'hidden_act'
  local act = setting(c, key, 'gelu_pytorch_tanh')
  s.activation = (not s.sandwich and act == 'gelu') and 'gelu_tanh' or activations[act]
  if not s.activation then pretrained.refuse(where, key, act, 'supported: gelu_pytorch_tanh, gelu_new, gelu, silu') end
  if c.use_bidirectional_attention == true then
    pretrained.refuse(where, 'use_bidirectional_attention', true, 'anatomy runs Gemma causally')
  end
  if s.family == 'gemma' then
    s.rope = pretrained.rope(c, where)
  elseif s.family == 'gemma2' then
    s.rope = pretrained.rope(c, where)
    s.attn_softcap = setting(c, 'attn_logit_softcapping', 50)
  else  -- transformers 5.23's Gemma 3 keeps attn_logit_softcapping and does not apply it: nor does anatomy
    s.rope, s.rope_local = gemma3_rope(c, where)
  end
  if s.rope.partial ~= 1 then pretrained.refuse(where, 'partial_rotary_factor', s.rope.partial, 'Gemma rotates whole heads') end
  if s.sandwich then
    s.scale = setting(c, 'query_pre_attn_scalar', 256) ^ -0.5
    s.final_softcap = setting(c, 'final_logit_softcapping', s.family == 'gemma2' and 30 or nil)
  end
  if multimodal then  -- transformers' Gemma3ForConditionalGeneration leaves final_logit_softcapping out: so does anatomy
    s.multimodal, s.unapplied_softcap, s.final_softcap = true, s.final_softcap, nil
  end
  s.types = layer_types(c, s, where)
  s.window = setting(c, 'sliding_window', 4096)
  for _, t in ipairs(s.types or {}) do
    if t == 'sliding_attention' and type(s.window) ~= 'number' then
      pretrained.refuse(where, 'sliding_window', c.sliding_window, 'its sliding_attention layers need a window')
    end
  end
  return s
end

-- Gemma's norm: RMSNorm scaling by 1 + weight
local function Norm(dim, o) return nn.RMSNorm(dim, {eps = o.eps, offset = 1}) end

local function attention(s, i)
  local sliding = s.types and s.types[i] == 'sliding_attention'
  return nn.RoPEAttention(s.dim, s.heads, pretrained.attention_options(sliding and s.rope_local or s.rope, {
    kv_heads = s.kv_heads, head_dim = s.head_dim, qkv_bias = s.bias, out_bias = s.bias, scale = s.scale,
    softcap = s.attn_softcap, sliding_window = sliding and s.window or nil,
    qk_norm = s.qk_norm and 'head' or nil, qk_norm_eps = s.qk_norm and s.eps or nil, qk_norm_offset = s.qk_norm and 1 or nil}))
end

-- Gemma 1's block: Llama's pre-norm layout
local Block = pretrained.prenorm_block('models.GemmaBlock', pretrained.llama_names, function(self, s, i)
  self.input_layernorm = Norm(s.dim, s)
  self.self_attn = attention(s, i)
  self.post_attention_layernorm = Norm(s.dim, s)
  self.mlp = nn.SwiGLU(s.dim, s.ffn, {activation = s.activation})
end)
models.GemmaBlock = Block

-- Gemma 2's and 3's block: each part between a norm before and one after
local Sandwich = nn.block('models.Gemma2Block', function(self, s, i)
  self.input_layernorm = Norm(s.dim, s)
  self.self_attn = attention(s, i)
  self.post_attention_layernorm = Norm(s.dim, s)
  self.pre_feedforward_layernorm = Norm(s.dim, s)
  self.mlp = nn.SwiGLU(s.dim, s.ffn, {activation = s.activation})
  self.post_feedforward_layernorm = Norm(s.dim, s)
end)
models.Gemma2Block = Sandwich
Sandwich.hook_names = pretrained.resid_hooks
-- its four norms by TransformerLens's names (probe/roles.lua): hook_attn_out and hook_mlp_out are then the post-norms' outputs
Sandwich.norm_roles = {ln1 = 'input_layernorm', ln1_post = 'post_attention_layernorm', ln2 = 'pre_feedforward_layernorm',
  ln2_post = 'post_feedforward_layernorm'}

-- block(x) -> x + post_norm(attn(norm(x))), then + post_norm(mlp(norm(.))), through the hook points
function Sandwich:forward(x)
  x = self:hook('resid_pre', x)
  x = self:hook('resid_mid', x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x))))
  return self:hook('resid_post', x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x))))
end

local Gemma = pretrained.model('models.Gemma', Norm, function(s) return s.sandwich and Sandwich or Block end,
  {embed = 'embed_tokens', stack = 'blocks', norm = 'norm', head = 'lm_head'}, {stack = 'model.layers'})

-- The hidden state the first block reads: the token embeddings times
-- √hidden_size, the factor in their dtype as transformers has it; published
-- as the model's hook point embed (TransformerLens's hook_embed)
function Gemma:embed(ids)
  local e = self.embed_tokens(ids)
  return self:hook('embed', e * torch.tensor(math.sqrt(self.config.dim), {dtype = e.dtype, device = e.device}))
end
Gemma.hook_names = {'embed'}

-- The head applied to a hidden state, the logits soft-capped (Gemma 2's
-- final_logit_softcapping), so the logit lens reads them as the model does
local readout = Gemma.readout
function Gemma:readout(h)
  local y, cap = readout(self, h), self.config.final_softcap
  if cap then y = (y / cap):tanh() * cap end
  return y
end

-- The checkpoint's settings as print(model) shows them (and the dropout it leaves out)
function Gemma:extra_repr()
  local s = self.config
  local sliding = 0
  for _, t in ipairs(s.types or {}) do if t == 'sliding_attention' then sliding = sliding + 1 end end
  return ('%s: vocab=%d, dim=%d, heads=%d, kv_heads=%d, head_dim=%d, layers=%d, ffn=%d%s%s%s%s'):format(
    s.family, s.vocab, s.dim, s.heads, s.kv_heads, s.head_dim, s.layers, s.ffn, s.tied and ', tied head' or '',
    sliding > 0 and (', %d sliding layers (window %d)'):format(sliding, s.window) or '',
    s.attn_softcap and (', attention softcap %g'):format(s.attn_softcap) or '',
    s.final_softcap and (', final softcap %g'):format(s.final_softcap) or '')
    .. (s.multimodal and ("; Gemma3ForConditionalGeneration's language model: its vision tower and multi-modal projector not loaded%s")
      :format(s.unapplied_softcap and (', final_logit_softcapping %g not applied (as transformers)'):format(s.unapplied_softcap) or '') or '')
    .. pretrained.config_note(self)
end

function F.build(s) return Gemma(s) end

-- A fresh norm's weight (models.from_config): 0, the scale 1 + 0, as transformers' _init_weights
F.norm_weight = 0

-- The parameters build makes from the settings, counted without making them
-- (pretrained.check_size), and the config keys they come from.
F.size_keys = pretrained.size_keys()
function F.parameters(s)
  local C = s.dim
  local q, kv, hd = pretrained.widths(s)  -- widths of q and of each of k, v; the head's
  local attn = 2 * C * q + 2 * C * kv + (s.bias and q + 2 * kv + C or 0) + (s.qk_norm and 2 * hd or 0)
  return s.vocab * C * (s.tied and 1 or 2) + s.layers * ((s.sandwich and 4 or 2) * C + attn + 3 * C * s.ffn) + C
end

-- {anatomy name, Hugging Face name}: ...ForCausalLM prefixes `model.`; a
-- checkpoint of the base model does not. Gemma3ForConditionalGeneration's:
-- language_model.model. and language_model.lm_head (the Hub's, and what
-- transformers 5.23's save_pretrained writes) or model.language_model. and
-- lm_head (its module names, which transformers reads too).
function F.weights(s, tensors)
  local prefix = (tensors == nil or tensors['model.embed_tokens.weight'] ~= nil) and 'model.' or ''  -- nil: the layout save_pretrained writes
  local head = 'lm_head.weight'
  if tensors and s.multimodal then
    prefix = tensors['model.language_model.embed_tokens.weight'] ~= nil and 'model.language_model.' or 'language_model.model.'
    head = prefix == 'model.language_model.' and head or 'language_model.lm_head.weight'
  end
  local list = {{'embed_tokens.weight', prefix .. 'embed_tokens.weight'}}
  local function add(name, hf) list[#list + 1] = {name, prefix .. hf} end
  local norms = s.sandwich and {'input_layernorm', 'post_attention_layernorm', 'pre_feedforward_layernorm', 'post_feedforward_layernorm'}
    or {'input_layernorm', 'post_attention_layernorm'}
  for i = 1, s.layers do
    local b, h = 'blocks.' .. i .. '.', 'layers.' .. (i - 1) .. '.'
    for _, n in ipairs(norms) do add(b .. n .. '.weight', h .. n .. '.weight') end
    for _, p in ipairs{'q', 'k', 'v', 'o'} do
      add(b .. 'self_attn.' .. p .. '.weight', h .. 'self_attn.' .. p .. '_proj.weight')
      if s.bias then add(b .. 'self_attn.' .. p .. '.bias', h .. 'self_attn.' .. p .. '_proj.bias') end
    end
    if s.qk_norm then
      for _, n in ipairs{'q_norm', 'k_norm'} do add(b .. 'self_attn.' .. n .. '.weight', h .. 'self_attn.' .. n .. '.weight') end
    end
    for _, p in ipairs{'gate', 'up', 'down'} do add(b .. 'mlp.' .. p .. '.weight', h .. 'mlp.' .. p .. '_proj.weight') end
  end
  add('norm.weight', 'norm.weight')
  if not s.tied then list[#list + 1] = {'lm_head.weight', head} end
  return list
end

-- The config save_pretrained writes: a multimodal one's language model as a
-- gemma3_text checkpoint (Gemma3ForCausalLM), the vision tower not being here,
-- with no final soft-capping, as the logits were
function F.saved_config(config, s)
  if not s.multimodal then return config end
  local cfg = text_config(config, 'save_pretrained')
  for _, k in ipairs{'dtype', 'torch_dtype', 'transformers_version'} do cfg[k] = config[k] end
  cfg.architectures, cfg.final_logit_softcapping = {'Gemma3ForCausalLM'}, json.null
  return cfg
end

-- Gemma's config settings transformers 5 takes only as floats (save_pretrained writes 30.0, not 30)
F.float_keys = {'final_logit_softcapping', 'attn_logit_softcapping'}

-- Not weights: rotary frequencies some checkpoints keep, a tied head saved
-- anyway; a multimodal checkpoint's vision tower and projector.
function F.ignored(name, s)
  if s and s.multimodal and (name:match('^vision_tower%.') or name:match('^multi_modal_projector%.')
      or name:match('^model%.vision_tower%.') or name:match('^model%.multi_modal_projector%.')) then
    return true
  end
  return name:match('rotary_emb%.inv_freq$') ~= nil or name == 'lm_head.weight' or name == 'language_model.lm_head.weight'
end

return F
