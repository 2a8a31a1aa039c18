-- models.Phi3: Hugging Face's Phi-3 (model_type "phi3": Phi-3, Phi-3.5,
-- Phi-4-mini) in the library's blocks, for models.from_pretrained. A Llama's
-- pre-norm block (RMSNorm, nn.RoPEAttention, nn.SwiGLU) whose checkpoint
-- fuses q, k, v into qkv_proj and gate, up into gate_up_proj (split here at
-- load, joined again by save_pretrained), with partial rotary (Phi-4-mini)
-- and long RoPE (rope_type 'longrope': short and long factors, and the
-- attention factor on cos and sin). Names: blocks.1 is model.layers.0.
local torch = require('anatomy.torch')
local nn = require('anatomy.nn')
local models = require('anatomy.models')
local json = require('anatomy.io.json')
local pretrained = require('anatomy.models.pretrained')

local F = {}

local function given(v) return v ~= nil and v ~= json.null end

-- RoPE as transformers 5.23's Phi3Config reads it: rope_scaling (the Hub's
-- form) before rope_parameters; 'su' and 'yarn' are its old names of
-- 'longrope'; original_max_position_embeddings is the top-level one (4096
-- when absent), whatever rope_parameters says. The attention factor, when
-- not given, is transformers' default: sqrt(1 + log(f) / log(original)) with
-- f = factor, or max_position_embeddings / original (1 when f <= 1).
local function rope(c, s, where)
  local from_scaling = type(c.rope_scaling) == 'table' and c.rope_scaling ~= json.null
  local p = from_scaling and c.rope_scaling or (type(c.rope_parameters) == 'table' and c.rope_parameters ~= json.null and c.rope_parameters) or {}
  local key = from_scaling and 'rope_scaling' or 'rope_parameters'
  local r = {theta = given(p.rope_theta) and p.rope_theta or (given(c.rope_theta) and c.rope_theta or 10000), scaling = 'default'}
  r.partial = given(p.partial_rotary_factor) and p.partial_rotary_factor or (given(c.partial_rotary_factor) and c.partial_rotary_factor or 1)
  s.rotary_dim = math.floor(s.head_dim * r.partial)
  if s.rotary_dim % 2 == 1 or s.rotary_dim < 2 or r.partial > 1 then
    pretrained.refuse(where, 'partial_rotary_factor', r.partial, ('it rotates %d of %d dims per head, not an even number from 2'):format(s.rotary_dim, s.head_dim))
  end
  local kind = p.rope_type or p.type or 'default'
  if kind == 'su' or kind == 'yarn' then kind = 'longrope' end
  if kind == 'default' then return r end
  if kind ~= 'longrope' then pretrained.refuse(where, key .. '.rope_type', kind, "Phi-3's are default and longrope") end
  r.scaling = 'longrope'
  for _, k in ipairs{'short_factor', 'long_factor'} do
    local f = p[k]
    if type(f) ~= 'table' or f == json.null or #f ~= s.rotary_dim / 2 then
      pretrained.refuse(where, key .. '.' .. k, f, ('longrope needs %d numbers, one per rotated pair'):format(s.rotary_dim / 2))
    end
    r[k] = f
  end
  r.original_max_positions = given(c.original_max_position_embeddings) and c.original_max_position_embeddings or 4096
  local factor = given(p.factor) and p.factor or s.positions / r.original_max_positions
  r.attention_factor = given(p.attention_factor) and p.attention_factor
    or (factor <= 1 and 1 or math.sqrt(1 + math.log(factor) / math.log(r.original_max_positions)))
  return r
end

function F.check(c, where)
  local function dim(key, optional) return pretrained.dim(c, key, where, optional) end
  local s = {
    family = 'phi3', vocab = dim('vocab_size'), dim = dim('hidden_size'), ffn = dim('intermediate_size'),
    layers = dim('num_hidden_layers'), heads = dim('num_attention_heads'), eps = given(c.rms_norm_eps) and c.rms_norm_eps or 1e-5,
    tied = c.tie_word_embeddings == true, positions = dim('max_position_embeddings', true) or 4096,
  }
  s.kv_heads = dim('num_key_value_heads', true) or s.heads
  s.head_dim = dim('head_dim', true) or math.floor(s.dim / s.heads)
  local act = given(c.hidden_act) and c.hidden_act or 'silu'
  if act ~= 'silu' then pretrained.refuse(where, 'hidden_act', act, 'the SwiGLU MLP gates with silu') end
  s.rope = rope(c, s, where)
  if type(c.sliding_window) == 'number' then s.window = c.sliding_window end  -- every layer's, as transformers' Phi3
  return s
end

local Block = pretrained.prenorm_block('models.Phi3Block', pretrained.llama_names, function(self, s)
  local r = s.rope
  self.input_layernorm = nn.RMSNorm(s.dim, {eps = s.eps})
  self.self_attn = nn.RoPEAttention(s.dim, s.heads, pretrained.attention_options(r, {kv_heads = s.kv_heads,
    head_dim = s.head_dim, rotary_dim = s.rotary_dim, sliding_window = s.window, short_factor = r.short_factor,
    long_factor = r.long_factor, attention_factor = r.attention_factor}))
  self.post_attention_layernorm = nn.RMSNorm(s.dim, {eps = s.eps})
  self.mlp = nn.SwiGLU(s.dim, s.ffn)
end)
models.Phi3Block = Block

local Phi3 = pretrained.model('models.Phi3', nn.RMSNorm, Block,
  {embed = 'embed_tokens', stack = 'blocks', norm = 'norm', head = 'lm_head'}, {stack = 'model.layers'})

-- model:kv_refill(past, total) -> whether generation, holding `past`
-- positions in its cache and about to read up to `total`, must run the whole
-- context again: under long RoPE the cached keys were rotated by the short
-- factors, and a forward reaching past original_max_position_embeddings
-- rotates by the long ones. transformers' Phi3ForCausalLM drops its cache at
-- that step (prepare_inputs_for_generation), so its generate equals a run
-- without cache; a bare forward under a cache mixes the two, as transformers' does.
function Phi3:kv_refill(past, total)
  local r = self.config.rope
  return r.scaling == 'longrope' and past <= r.original_max_positions and total > r.original_max_positions
end

-- The checkpoint's settings as print(model) shows them (and the dropout it leaves out)
function Phi3:extra_repr()
  local s, r = self.config, self.config.rope
  return ('vocab=%d, dim=%d, heads=%d, kv_heads=%d, layers=%d, ffn=%d, rotary_dim=%d%s%s%s'):format(
    s.vocab, s.dim, s.heads, s.kv_heads, s.layers, s.ffn, s.rotary_dim, s.tied and ', tied head' or '',
    r.scaling == 'longrope' and (', longrope past %d positions (attention factor %.4g)'):format(r.original_max_positions, r.attention_factor) or '',
    s.window and (', sliding_window=%d'):format(s.window) or '') .. pretrained.config_note(self)
end

function F.build(s) return Phi3(s) end

-- The parameters build makes from the settings, counted without making them
-- (pretrained.check_size), and the config keys they come from.
F.size_keys = pretrained.size_keys()
function F.parameters(s)
  local C = s.dim
  local q, kv = pretrained.widths(s)  -- widths of q and of each of k, v
  return s.vocab * C * (s.tied and 1 or 2) + s.layers * (2 * C + 2 * C * q + 2 * C * kv + 3 * C * s.ffn) + C
end

-- {anatomy name, Hugging Face name, convert}: Phi3ForCausalLM prefixes
-- `model.`; a checkpoint of the base Phi3Model does not. qkv_proj's rows are
-- q (heads x head_dim), then k and v (kv_heads x head_dim each);
-- gate_up_proj's the gate, then up (ffn each). Each part is cut out at load,
-- and F.fuse joins them in this order on save.
function F.weights(s, tensors)
  local prefix = (tensors == nil or tensors['model.embed_tokens.weight'] ~= nil) and 'model.' or ''  -- nil: the layout save_pretrained writes
  local list = {{'embed_tokens.weight', prefix .. 'embed_tokens.weight'}}
  local function add(name, hf, convert) list[#list + 1] = {name, prefix .. hf, convert} end
  -- rows from..from+n-1 of a fused tensor of `total` rows
  local function rows(hf, total, from, n)
    return function(t)
      if t:size(1) ~= total then
        error(('models.from_pretrained: %s%s has %d rows in the checkpoint, expected %d'):format(prefix, hf, t:size(1), total), 0)
      end
      return t:narrow(1, from, n)
    end
  end
  local q, kv, ffn = s.heads * s.head_dim, s.kv_heads * s.head_dim, s.ffn
  for i = 1, s.layers do
    local b, h = 'blocks.' .. i .. '.', 'layers.' .. (i - 1) .. '.'
    add(b .. 'input_layernorm.weight', h .. 'input_layernorm.weight')
    add(b .. 'post_attention_layernorm.weight', h .. 'post_attention_layernorm.weight')
    local qkv = h .. 'self_attn.qkv_proj.weight'
    add(b .. 'self_attn.q.weight', qkv, rows(qkv, q + 2 * kv, 1, q))
    add(b .. 'self_attn.k.weight', qkv, rows(qkv, q + 2 * kv, q + 1, kv))
    add(b .. 'self_attn.v.weight', qkv, rows(qkv, q + 2 * kv, q + kv + 1, kv))
    add(b .. 'self_attn.o.weight', h .. 'self_attn.o_proj.weight')
    local gate_up = h .. 'mlp.gate_up_proj.weight'
    add(b .. 'mlp.gate.weight', gate_up, rows(gate_up, 2 * ffn, 1, ffn))
    add(b .. 'mlp.up.weight', gate_up, rows(gate_up, 2 * ffn, ffn + 1, ffn))
    add(b .. 'mlp.down.weight', h .. 'mlp.down_proj.weight')
  end
  add('norm.weight', 'norm.weight')
  if not s.tied then list[#list + 1] = {'lm_head.weight', 'lm_head.weight'} end
  return list
end

-- The inverse of F.weights' cuts: the parts of qkv_proj (q, k, v) or of
-- gate_up_proj (gate, up), in their order, stacked by rows.
function F.fuse(_, parts) return torch.cat(parts, 1) end

-- Not weights: rotary frequencies some checkpoints keep, a tied head saved anyway.
function F.ignored(name)
  return name:match('rotary_emb%.inv_freq$') ~= nil or name == 'lm_head.weight'
end

return F
