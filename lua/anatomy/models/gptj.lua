-- models.GPTJ: Hugging Face's GPT-J (model_type "gptj") in the library's
-- blocks, for models.from_pretrained. Phi's parallel block (one LayerNorm,
-- x + attn(ln_1(x)) + mlp(ln_1(x))) with GPT-J's parts: nn.RoPEAttention
-- without biases, rotating the first rotary_dim dims of each head in
-- interleaved pairs (2i, 2i+1) at base 10000; nn.MLP (fc_in, gelu_new,
-- fc_out); ln_f; an untied head with a bias. Names follow Hugging Face's with
-- layers counted from 1: h.1 is transformer.h.0.
local nn = require('anatomy.nn')
local json = require('anatomy.io.json')
local models = require('anatomy.models')
local pretrained = require('anatomy.models.pretrained')

local F = {}

function F.check(c, where)
  local function dim(key, optional) return pretrained.dim(c, key, where, optional) end
  local s = {
    vocab = dim('vocab_size'), positions = dim('n_positions'), dim = dim('n_embd'), layers = dim('n_layer'),
    heads = dim('n_head'), eps = c.layer_norm_epsilon or 1e-5, head_bias = true,
  }
  s.ffn = dim('n_inner', true) or 4 * s.dim
  local act = c.activation_function or 'gelu_new'
  s.activation = pretrained.activations[act]
  if not s.activation then pretrained.refuse(where, 'activation_function', act, 'supported: gelu_new, gelu_pytorch_tanh, gelu, relu') end
  if s.dim % s.heads ~= 0 then pretrained.refuse(where, 'n_embd', s.dim, ('not divisible by n_head = %d'):format(s.heads)) end
  s.head_dim = math.floor(s.dim / s.heads)
  if c.tie_word_embeddings == true then
    pretrained.refuse(where, 'tie_word_embeddings', true, "GPT-J's head has a bias of its own; anatomy ties only a head without one")
  end
  -- absent: transformers' default, 64; null (older transformers' whole head) transformers 5.23 refuses too
  if c.rotary_dim == json.null then pretrained.refuse(where, 'rotary_dim', json.null, 'a number of dims per head to rotate, as transformers 5.23 asks') end
  s.rotary_dim = dim('rotary_dim', true) or 64
  if s.rotary_dim % 2 == 1 or s.rotary_dim > s.head_dim then
    pretrained.refuse(where, 'rotary_dim', s.rotary_dim, ('it must be even and at most the head size, %d'):format(s.head_dim))
  end
  return s
end

local Block = pretrained.parallel_block('models.GPTJBlock', {norm = 'ln_1', attn = 'attn', mlp = 'mlp'}, function(self, s)
  self.ln_1 = nn.LayerNorm(s.dim, {eps = s.eps})
  -- transformers' GPT-J has no theta setting: its sinusoids are at base 10000
  self.attn = nn.RoPEAttention(s.dim, s.heads, {rotary_dim = s.rotary_dim, interleaved = true, theta = 10000})
  self.mlp = nn.MLP(s.dim, s.ffn, {activation = s.activation})
end)
models.GPTJBlock = Block

-- GPTJForCausalLM's names start with transformer. (transformer.h.0.attn), as GPT-2's
local GPTJ = pretrained.model('models.GPTJ', nn.LayerNorm, Block, {embed = 'wte', stack = 'h', norm = 'ln_f', head = 'lm_head'},
  {prefix = 'transformer.'})

-- The checkpoint's settings as print(model) shows them (and the dropout it leaves out)
function GPTJ:extra_repr()
  local s = self.config
  return ('vocab=%d, dim=%d, heads=%d, layers=%d, positions=%d, ffn=%d, rotary_dim=%d interleaved, parallel attention and MLP'):format(
    s.vocab, s.dim, s.heads, s.layers, s.positions, s.ffn, s.rotary_dim) .. pretrained.config_note(self)
end

function F.build(s) return GPTJ(s) end

-- The parameters build makes from the settings, counted without making them
-- (pretrained.check_size), and the config keys they come from.
F.size_keys = {'n_layer', 'n_embd', 'n_inner', 'vocab_size'}
function F.parameters(s)
  local C = s.dim
  local block = 2 * C + 4 * C * C + (C * s.ffn + s.ffn) + (s.ffn * C + C)  -- ln_1, q k v o, fc_in, fc_out
  return 2 * s.vocab * C + s.vocab + s.layers * block + 2 * C
end

-- {anatomy name, Hugging Face name}: GPTJForCausalLM prefixes `transformer.`;
-- a checkpoint of the base GPTJModel does not (and, having no head, is
-- refused naming lm_head.weight).
local renamed = {q = 'q_proj', k = 'k_proj', v = 'v_proj', o = 'out_proj', fc = 'fc_in', proj = 'fc_out'}
function F.weights(s, tensors)
  local prefix = (tensors == nil or tensors['transformer.wte.weight'] ~= nil) and 'transformer.' or ''  -- nil: the layout save_pretrained writes
  local list = {{'wte.weight', prefix .. 'wte.weight'}}
  local function add(name, hf, biased)
    list[#list + 1] = {name .. '.weight', prefix .. hf .. '.weight'}
    if biased then list[#list + 1] = {name .. '.bias', prefix .. hf .. '.bias'} end
  end
  for i = 1, s.layers do
    local b, h = 'h.' .. i .. '.', 'h.' .. (i - 1) .. '.'
    add(b .. 'ln_1', h .. 'ln_1', true)
    for _, p in ipairs{'q', 'k', 'v', 'o'} do add(b .. 'attn.' .. p, h .. 'attn.' .. renamed[p]) end
    for _, p in ipairs{'fc', 'proj'} do add(b .. 'mlp.' .. p, h .. 'mlp.' .. renamed[p], true) end
  end
  add('ln_f', 'ln_f', true)
  list[#list + 1] = {'lm_head.weight', 'lm_head.weight'}
  list[#list + 1] = {'lm_head.bias', 'lm_head.bias'}
  return list
end

-- Not weights: the causal-mask buffers and the sinusoid table older checkpoints keep.
function F.ignored(name)
  return name:match('%.attn%.bias$') ~= nil or name:match('%.attn%.masked_bias$') ~= nil or name:match('%.attn%.embed_positions$') ~= nil
end

return F
