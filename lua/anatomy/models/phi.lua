-- models.Phi: Hugging Face's Phi (model_type "phi": Phi-1, Phi-1.5, Phi-2) in
-- the library's blocks, for models.from_pretrained. One LayerNorm per block
-- feeding attention and MLP in parallel, x + attn(ln(x)) + mlp(ln(x));
-- nn.RoPEAttention with partial rotary and biases on q, k, v and dense; nn.MLP
-- (fc1, gelu_new, fc2); a final LayerNorm; an untied head with a bias.
-- Names follow Hugging Face's, except the stack: blocks.1 is model.layers.0.
local nn = require('anatomy.nn')
local models = require('anatomy.models')
local pretrained = require('anatomy.models.pretrained')

local F = {}

function F.check(c, where)
  local function dim(key, optional) return pretrained.dim(c, key, where, optional) end
  local s = {
    vocab = dim('vocab_size'), dim = dim('hidden_size'), ffn = dim('intermediate_size'),
    layers = dim('num_hidden_layers'), heads = dim('num_attention_heads'), eps = c.layer_norm_eps or 1e-5,
    positions = dim('max_position_embeddings', true), head_bias = true,
  }
  s.kv_heads = dim('num_key_value_heads', true) or s.heads
  s.head_dim = dim('head_dim', true) or math.floor(s.dim / s.heads)
  s.activation = pretrained.activations[c.hidden_act or 'gelu_new']
  if not s.activation then pretrained.refuse(where, 'hidden_act', c.hidden_act, 'supported: gelu, gelu_new, gelu_pytorch_tanh, relu') end
  if c.qk_layernorm == true then pretrained.refuse(where, 'qk_layernorm', true, 'anatomy has no norm on queries and keys') end
  if c.tie_word_embeddings == true then
    pretrained.refuse(where, 'tie_word_embeddings', true, "Phi's head has a bias of its own; anatomy ties only a head without one")
  end
  s.rope = pretrained.rope(c, where)
  -- the Hub's configs name it at the top level; transformers' default is 0.5
  local p = type(c.rope_parameters) == 'table' and c.rope_parameters.partial_rotary_factor or c.partial_rotary_factor or 0.5
  s.rope.partial = p
  s.rotary_dim = math.floor(s.head_dim * p)
  if s.rotary_dim % 2 == 1 or s.rotary_dim < 2 then
    pretrained.refuse(where, 'partial_rotary_factor', p, ('it rotates %d of %d dims per head, not an even number from 2'):format(s.rotary_dim, s.head_dim))
  end
  return s
end

local Block = pretrained.parallel_block('models.PhiBlock', {norm = 'input_layernorm', attn = 'self_attn', mlp = 'mlp'}, function(self, s)
  self.input_layernorm = nn.LayerNorm(s.dim, {eps = s.eps})
  self.self_attn = nn.RoPEAttention(s.dim, s.heads, pretrained.attention_options(s.rope, {kv_heads = s.kv_heads,
    head_dim = s.head_dim, rotary_dim = s.rotary_dim, qkv_bias = true, out_bias = true}))
  self.mlp = nn.MLP(s.dim, s.ffn, {activation = s.activation})
end)
models.PhiBlock = Block

local Phi = pretrained.model('models.Phi', nn.LayerNorm, Block,
  {embed = 'embed_tokens', stack = 'blocks', norm = 'final_layernorm', head = 'lm_head'}, {stack = 'model.layers'})

-- The checkpoint's settings as print(model) shows them (and the dropout it leaves out)
function Phi:extra_repr()
  local s = self.config
  return ('vocab=%d, dim=%d, heads=%d, kv_heads=%d, layers=%d, ffn=%d, rotary_dim=%d, parallel attention and MLP'):format(
    s.vocab, s.dim, s.heads, s.kv_heads, s.layers, s.ffn, s.rotary_dim) .. pretrained.config_note(self)
end

function F.build(s) return Phi(s) end

-- The parameters build makes from the settings, counted without making them
-- (pretrained.check_size), and the config keys they come from.
F.size_keys = pretrained.size_keys()
function F.parameters(s)
  local C = s.dim
  local q, kv = pretrained.widths(s)  -- widths of q and of each of k, v
  local attn = 2 * C * q + 2 * C * kv + q + 2 * kv + C
  local mlp = 2 * C * s.ffn + s.ffn + C
  return 2 * s.vocab * C + s.vocab + s.layers * (2 * C + attn + mlp) + 2 * C
end

-- {anatomy name, Hugging Face name}: PhiForCausalLM prefixes `model.`; a
-- checkpoint of the base PhiModel does not.
local renamed = {q_proj = 'q', k_proj = 'k', v_proj = 'v', dense = 'o', fc1 = 'fc', fc2 = 'proj'}
function F.weights(s, tensors)
  local prefix = (tensors == nil or tensors['model.embed_tokens.weight'] ~= nil) and 'model.' or ''  -- nil: the layout save_pretrained writes
  local list = {{'embed_tokens.weight', prefix .. 'embed_tokens.weight'}}
  local function add(name, hf)
    for _, p in ipairs{'weight', 'bias'} do list[#list + 1] = {name .. '.' .. p, prefix .. hf .. '.' .. p} end
  end
  for i = 1, s.layers do
    local b, h = 'blocks.' .. i .. '.', 'layers.' .. (i - 1) .. '.'
    add(b .. 'input_layernorm', h .. 'input_layernorm')
    for _, p in ipairs{'q_proj', 'k_proj', 'v_proj', 'dense'} do add(b .. 'self_attn.' .. renamed[p], h .. 'self_attn.' .. p) end
    for _, p in ipairs{'fc1', 'fc2'} do add(b .. 'mlp.' .. renamed[p], h .. 'mlp.' .. p) end
  end
  add('final_layernorm', 'final_layernorm')
  list[#list + 1] = {'lm_head.weight', 'lm_head.weight'}
  list[#list + 1] = {'lm_head.bias', 'lm_head.bias'}
  return list
end

-- Not weights: rotary frequencies some checkpoints keep.
function F.ignored(name) return name:match('rotary_emb%.inv_freq$') ~= nil end

return F
