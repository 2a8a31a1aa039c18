-- models.GPTNeoX: Hugging Face's GPT-NeoX (model_type "gpt_neox": Pythia) in
-- the library's blocks, for models.from_pretrained. Blocks of LayerNorm,
-- nn.RoPEAttention with partial rotary (rotary_pct) and biases, and nn.MLP;
-- the parallel residual x + attn(ln1(x)) + mlp(ln2(x)) or the sequential one
-- (use_parallel_residual); a final LayerNorm; an untied head (embed_out).
-- Names follow Hugging Face's, except the stack: blocks.1 is
-- gpt_neox.layers.0.
local torch = require('anatomy.torch')
local nn = require('anatomy.nn')
local models = require('anatomy.models')
local pretrained = require('anatomy.models.pretrained')

local F = {}

local activations = pretrained.activations

function F.check(c, where)
  local function dim(key, optional) return pretrained.dim(c, key, where, optional) end
  local s = {
    vocab = dim('vocab_size'), dim = dim('hidden_size'), ffn = dim('intermediate_size'),
    layers = dim('num_hidden_layers'), heads = dim('num_attention_heads'), eps = c.layer_norm_eps or 1e-5,
    parallel = c.use_parallel_residual ~= false, tied = c.tie_word_embeddings == true,
    bias = c.attention_bias ~= false, positions = dim('max_position_embeddings', true),
  }
  s.activation = activations[c.hidden_act or 'gelu']
  if not s.activation then pretrained.refuse(where, 'hidden_act', c.hidden_act, 'supported: gelu, gelu_new, gelu_pytorch_tanh, relu') end
  if s.dim % s.heads ~= 0 then pretrained.refuse(where, 'hidden_size', s.dim, ('not divisible by num_attention_heads = %d'):format(s.heads)) end
  s.rope = pretrained.rope(c, where)
  s.head_dim = math.floor(s.dim / s.heads)
  s.rotary_dim = math.floor(s.head_dim * s.rope.partial)
  if s.rotary_dim % 2 == 1 then
    pretrained.refuse(where, 'rotary_pct', s.rope.partial, ('it rotates an odd %d of %d dims per head'):format(s.rotary_dim, s.head_dim))
  end
  return s
end

local Block = nn.block('models.GPTNeoXBlock', function(self, s)
  rawset(self, 'parallel', s.parallel)
  self.input_layernorm = nn.LayerNorm(s.dim, {eps = s.eps})
  self.attention = nn.RoPEAttention(s.dim, s.heads, pretrained.attention_options(s.rope, {rotary_dim = s.rotary_dim,
    qkv_bias = s.bias, out_bias = s.bias}))
  self.post_attention_layernorm = nn.LayerNorm(s.dim, {eps = s.eps})
  self.mlp = nn.MLP(s.dim, s.ffn, {activation = s.activation})
end)
models.GPTNeoXBlock = Block

-- resid_mid only with the sequential residual (the parallel one has no stream between the two)
Block.hook_names = pretrained.resid_hooks

-- block(x) -> x + attn(ln1(x)) + mlp(ln2(x)) (parallel residual), or the two in sequence
function Block:forward(x)
  if self.parallel then
    x = self:hook('resid_pre', x)
    return self:hook('resid_post', x + self.attention(self.input_layernorm(x)) + self.mlp(self.post_attention_layernorm(x)))
  end
  local y = pretrained.prenorm(self, x, self.attention, self.input_layernorm, self.mlp, self.post_attention_layernorm)
  return y
end

-- Whether the block adds attention and MLP in parallel or one after the other, as print(model) shows it
function Block:extra_repr() return self.parallel and 'parallel residual' or 'sequential residual' end

local GPTNeoX = pretrained.model('models.GPTNeoX', nn.LayerNorm, Block,
  {embed = 'embed_in', stack = 'blocks', norm = 'final_layer_norm', head = 'embed_out'}, {stack = 'gpt_neox.layers'})

-- The checkpoint's settings as print(model) shows them (and the dropout it leaves out)
function GPTNeoX:extra_repr()
  local s = self.config
  return ('vocab=%d, dim=%d, heads=%d, layers=%d, ffn=%d, rotary_dim=%d, %s residual'):format(
    s.vocab, s.dim, s.heads, s.layers, s.ffn, s.rotary_dim, s.parallel and 'parallel' or 'sequential') .. pretrained.config_note(self)
end

function F.build(s) return GPTNeoX(s) end

-- The parameters build makes from the settings, counted without making them
-- (pretrained.check_size), and the config keys they come from.
F.size_keys = {'num_hidden_layers', 'hidden_size', 'intermediate_size', 'vocab_size'}
function F.parameters(s)
  local C = s.dim
  local attn = 4 * C * C + (s.bias and 4 * C or 0)  -- q, k, v, o
  local mlp = 2 * C * s.ffn + s.ffn + C
  return s.vocab * C * (s.tied and 1 or 2) + s.layers * (4 * C + attn + mlp) + 2 * C
end

-- GPT-NeoX fuses q, k and v per head: rows of query_key_value are (head,
-- {q, k, v}, head dim). part(i) takes q (1), k (2) or v (3) of every head.
local function part(s, i)
  return function(t)
    local shape = t:dim() == 2 and {s.heads, 3, s.head_dim, t:size(2)} or {s.heads, 3, s.head_dim}
    local picked = t:reshape(shape):select(2, i)
    return picked:reshape(t:dim() == 2 and {s.heads * s.head_dim, t:size(2)} or {s.heads * s.head_dim}):contiguous()
  end
end

-- The inverse of part: q, k and v of every head back into query_key_value.
function F.fuse(s, parts)
  local q, k, v = parts[1], parts[2], parts[3]
  local per_head = function(t)
    return t:dim() == 2 and t:reshape({s.heads, 1, s.head_dim, t:size(2)}) or t:reshape({s.heads, 1, s.head_dim})
  end
  local fused = torch.cat({per_head(q), per_head(k), per_head(v)}, 2)
  return fused:reshape(q:dim() == 2 and {3 * s.dim, q:size(2)} or {3 * s.dim}):contiguous()
end

function F.weights(s, tensors)
  local prefix = (tensors == nil or tensors['gpt_neox.embed_in.weight'] ~= nil) and 'gpt_neox.' or ''  -- nil: the layout save_pretrained writes
  local list = {{'embed_in.weight', prefix .. 'embed_in.weight'}}
  local function add(name, hf, convert) list[#list + 1] = {name, prefix .. hf, convert} end
  for i = 1, s.layers do
    local b, h = 'blocks.' .. i .. '.', 'layers.' .. (i - 1) .. '.'
    for _, n in ipairs{'input_layernorm', 'post_attention_layernorm'} do
      add(b .. n .. '.weight', h .. n .. '.weight'); add(b .. n .. '.bias', h .. n .. '.bias')
    end
    for k, p in ipairs{'q', 'k', 'v'} do
      add(b .. 'attention.' .. p .. '.weight', h .. 'attention.query_key_value.weight', part(s, k))
      if s.bias then add(b .. 'attention.' .. p .. '.bias', h .. 'attention.query_key_value.bias', part(s, k)) end
    end
    add(b .. 'attention.o.weight', h .. 'attention.dense.weight')
    if s.bias then add(b .. 'attention.o.bias', h .. 'attention.dense.bias') end
    add(b .. 'mlp.fc.weight', h .. 'mlp.dense_h_to_4h.weight'); add(b .. 'mlp.fc.bias', h .. 'mlp.dense_h_to_4h.bias')
    add(b .. 'mlp.proj.weight', h .. 'mlp.dense_4h_to_h.weight'); add(b .. 'mlp.proj.bias', h .. 'mlp.dense_4h_to_h.bias')
  end
  add('final_layer_norm.weight', 'final_layer_norm.weight'); add('final_layer_norm.bias', 'final_layer_norm.bias')
  if not s.tied then list[#list + 1] = {'embed_out.weight', 'embed_out.weight'} end
  return list
end

function F.ignored(name)
  return name:match('%.attention%.bias$') ~= nil or name:match('%.attention%.masked_bias$') ~= nil
    or name:match('rotary_emb%.inv_freq$') ~= nil or name == 'embed_out.weight'
end

return F
