-- models.GPT2: Hugging Face's GPT-2 (model_type "gpt2") in the library's
-- blocks, for models.from_pretrained. Pre-norm blocks of LayerNorm, causal
-- attention with a fused qkv projection and an MLP; learned positions; the
-- head tied to the token embedding unless the config unties it.
-- Names follow Hugging Face's with layers counted from 1: h.1 is h.0.
local nn = require('anatomy.nn')
local models = require('anatomy.models')
local pretrained = require('anatomy.models.pretrained')

local F = {}

local activations = pretrained.activations

-- config.json -> settings; a switch anatomy does not honour is an error naming it.
function F.check(c, where)
  local function dim(key, optional) return pretrained.dim(c, key, where, optional) end
  local s = {
    vocab = dim('vocab_size'), positions = dim('n_positions'), dim = dim('n_embd'), layers = dim('n_layer'),
    heads = dim('n_head'), eps = c.layer_norm_epsilon or 1e-5,
    tied = c.tie_word_embeddings ~= false,
  }
  s.ffn = dim('n_inner', true) or 4 * s.dim
  local act = c.activation_function or 'gelu_new'
  s.activation = activations[act]
  if not s.activation then pretrained.refuse(where, 'activation_function', act, 'supported: gelu_new, gelu_pytorch_tanh, gelu, relu') end
  if s.dim % s.heads ~= 0 then pretrained.refuse(where, 'n_embd', s.dim, ('not divisible by n_head = %d'):format(s.heads)) end
  if c.scale_attn_weights == false then pretrained.refuse(where, 'scale_attn_weights', false, 'attention is always scaled by 1/sqrt(head dim)') end
  if c.scale_attn_by_inverse_layer_idx then
    pretrained.refuse(where, 'scale_attn_by_inverse_layer_idx', true, 'attention is scaled by 1/sqrt(head dim) only')
  end
  if c.reorder_and_upcast_attn then
    pretrained.refuse(where, 'reorder_and_upcast_attn', true, 'attention scores are computed in the model\'s dtype')
  end
  if c.add_cross_attention then pretrained.refuse(where, 'add_cross_attention', true, 'decoder-only models') end
  return s
end

-- x + attn(ln_1(x)), then + mlp(ln_2(.)), through resid_pre, resid_mid and resid_post
local Block = pretrained.prenorm_block('models.GPT2Block', {ln1 = 'ln_1', attn = 'attn', ln2 = 'ln_2', mlp = 'mlp'}, function(self, s)
  self.ln_1 = nn.LayerNorm(s.dim, {eps = s.eps})
  self.attn = nn.Attention(s.dim, s.heads, {causal = true})
  self.ln_2 = nn.LayerNorm(s.dim, {eps = s.eps})
  self.mlp = nn.MLP(s.dim, s.ffn, {activation = s.activation})
end)
models.GPT2Block = Block

-- GPT2LMHeadModel's names start with transformer. (transformer.h.0.attn): the
-- spelling probe.resolve_name shows a user beside anatomy's (h.1.attn)
local GPT2 = pretrained.model('models.GPT2', nn.LayerNorm, Block,
  {embed = 'wte', positions = 'wpe', stack = 'h', norm = 'ln_f', head = 'lm_head'}, {prefix = 'transformer.'})

-- The hidden state the first block reads: token plus position embeddings.
-- While caching (model:kv_cache), the positions go on from those already
-- seen; under a padding mask (model:set_padding), each example's count its
-- real tokens.
function GPT2:embed(ids)
  local T = ids:size(-1)
  local first = rawget(self, '_past') or 0
  if first + T > self.config.positions then
    error(('models.GPT2: %d tokens exceed the %d learned positions'):format(first + T, self.config.positions), 2)
  end
  local tokens = self.wte(ids)
  if rawget(self, '_past') then rawset(self, '_past', first + T) end
  -- the position rows, published as the model's hook point pos_embed
  -- (TransformerLens's hook_pos_embed), (B, T, C) as the token part is
  local mask = rawget(self, '_mask')
  local rows
  if mask then
    local pos = (mask:long():cumsum(2) - 1):clamp_min(0)
    rows = self.wpe(pos:narrow(2, pos:size(2) - T + 1, T) + 1)
  else
    rows = self.wpe.weight:narrow(1, first + 1, T):expand(unpack(tokens:size()))
  end
  return tokens + self:hook('pos_embed', rows)
end
GPT2.hook_names = {'pos_embed'}
-- m:set_cache(on): starts (true) or stops (false) counting the positions embed has seen (model:kv_cache)
function GPT2:set_cache(on) rawset(self, '_past', on and 0 or nil) end
-- m:set_mask(mask): the padding mask embed counts positions by (model:set_padding)
function GPT2:set_mask(mask) rawset(self, '_mask', mask) end

-- The checkpoint's settings as print(model) shows them (and the dropout it leaves out)
function GPT2:extra_repr()
  local s = self.config
  return ('vocab=%d, dim=%d, heads=%d, layers=%d, positions=%d, ffn=%d%s'):format(
    s.vocab, s.dim, s.heads, s.layers, s.positions, s.ffn, s.tied and ', tied head' or '') .. pretrained.config_note(self)
end

function F.build(s) return GPT2(s) end

-- The parameters build makes from the settings, counted without making them
-- (pretrained.check_size), and the config keys they come from.
F.size_keys = {'n_layer', 'n_embd', 'n_inner', 'vocab_size', 'n_positions'}
function F.parameters(s)
  local C, ffn = s.dim, s.ffn
  local block = 4 * C + (3 * C * C + 3 * C) + (C * C + C) + (C * ffn + ffn) + (ffn * C + C)  -- ln_1, ln_2, qkv, proj, MLP
  return (s.vocab + s.positions) * C + s.layers * block + 2 * C + (s.tied and 0 or s.vocab * C)
end

-- {anatomy name, Hugging Face name, stored transposed}: GPT-2's Conv1D keeps
-- its weights as [in, out]. A checkpoint saved from GPT2LMHeadModel prefixes
-- `transformer.`; one saved from the base GPT2Model (the Hub's gpt2) does not.
function F.weights(s, tensors)
  local prefix = (tensors == nil or tensors['transformer.wte.weight'] ~= nil) and 'transformer.' or ''  -- nil: the layout save_pretrained writes
  local list = {{'wte.weight', prefix .. 'wte.weight'}, {'wpe.weight', prefix .. 'wpe.weight'}}
  local function add(name, transposed) list[#list + 1] = {name, prefix .. pretrained.hf_name(name), transposed} end
  for i = 1, s.layers do
    local b = 'h.' .. i .. '.'
    add(b .. 'ln_1.weight'); add(b .. 'ln_1.bias'); add(b .. 'ln_2.weight'); add(b .. 'ln_2.bias')
    list[#list + 1] = {b .. 'attn.qkv.weight', prefix .. pretrained.hf_name(b) .. 'attn.c_attn.weight', true}
    list[#list + 1] = {b .. 'attn.qkv.bias', prefix .. pretrained.hf_name(b) .. 'attn.c_attn.bias'}
    list[#list + 1] = {b .. 'attn.proj.weight', prefix .. pretrained.hf_name(b) .. 'attn.c_proj.weight', true}
    list[#list + 1] = {b .. 'attn.proj.bias', prefix .. pretrained.hf_name(b) .. 'attn.c_proj.bias'}
    list[#list + 1] = {b .. 'mlp.fc.weight', prefix .. pretrained.hf_name(b) .. 'mlp.c_fc.weight', true}
    list[#list + 1] = {b .. 'mlp.fc.bias', prefix .. pretrained.hf_name(b) .. 'mlp.c_fc.bias'}
    list[#list + 1] = {b .. 'mlp.proj.weight', prefix .. pretrained.hf_name(b) .. 'mlp.c_proj.weight', true}
    list[#list + 1] = {b .. 'mlp.proj.bias', prefix .. pretrained.hf_name(b) .. 'mlp.c_proj.bias'}
  end
  add('ln_f.weight'); add('ln_f.bias')
  if not s.tied then list[#list + 1] = {'lm_head.weight', 'lm_head.weight'} end
  return list
end

-- Tensors a GPT-2 checkpoint may carry that are not weights: the causal-mask
-- buffers of old checkpoints, and a tied head saved anyway.
function F.ignored(name)
  return name:match('%.attn%.bias$') ~= nil or name:match('%.attn%.masked_bias$') ~= nil or name == 'lm_head.weight'
end

return F
