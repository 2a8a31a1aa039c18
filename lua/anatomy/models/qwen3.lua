-- models.Qwen3: Hugging Face's Qwen3 and Qwen3-MoE (model_type "qwen3",
-- "qwen3_moe") in the library's blocks, for models.from_pretrained. Llama's
-- block (models/llama.lua: its config checks, pre-norm RMSNorm, grouped-query
-- nn.RoPEAttention) with an RMSNorm over each head's queries and keys before
-- the rotation (qk_norm = 'head'), and, in Qwen3-MoE, nn.MoE in the MLP's
-- place on every decoder_sparse_step-th layer not in mlp_only_layers (the
-- others: a SwiGLU of intermediate_size). Names follow Hugging Face's, except
-- the stack: blocks.1 is model.layers.0.
local nn = require('anatomy.nn')
local models = require('anatomy.models')
local pretrained = require('anatomy.models.pretrained')
local llama = require('anatomy.models.llama')

local F = {}

-- Qwen3-MoE's experts: num_experts (transformers 5 writes num_local_experts) of
-- moe_intermediate_size, num_experts_per_tok of them per token, renormalised only
-- where norm_topk_prob (false unless set). s.sparse[i]: layer i's MLP is the MoE.
local function moe(c, s, where)
  local experts = type(c.num_local_experts) == 'number' and 'num_local_experts' or 'num_experts'
  local E = c[experts]
  if E == 0 then return end  -- transformers: no sparse layer
  local m = {experts = pretrained.dim(c, experts, where), top_k = pretrained.dim(c, 'num_experts_per_tok', where),
    ffn = pretrained.dim(c, 'moe_intermediate_size', where), norm_topk_prob = c.norm_topk_prob == true}
  if m.top_k > m.experts then
    pretrained.refuse(where, 'num_experts_per_tok', m.top_k, ('more than %s = %d'):format(experts, m.experts))
  end
  if c.output_router_logits == true then
    pretrained.refuse(where, 'output_router_logits', true, "transformers then adds the router's auxiliary loss to the loss; anatomy's loss is the language model's")
  end
  local step = pretrained.dim(c, 'decoder_sparse_step', where, true) or 1
  local dense = {}
  for _, l in ipairs(type(c.mlp_only_layers) == 'table' and c.mlp_only_layers or {}) do
    if type(l) ~= 'number' or l % 1 ~= 0 or l < 0 or l >= s.layers then
      pretrained.refuse(where, 'mlp_only_layers', c.mlp_only_layers, ('layer numbers from 0 to %d'):format(s.layers - 1))
    end
    dense[l + 1] = true
  end
  s.moe, s.sparse = m, {}
  for i = 1, s.layers do s.sparse[i] = not dense[i] and i % step == 0 end
end

-- Sliding windows, only with use_sliding_window: Qwen3's on the layers
-- layer_types names sliding_attention (transformers 5 writes it; without it,
-- from layer max_window_layers on, counted from 0); Qwen3-MoE's on every layer.
local function windows(c, s, where)
  if not (c.use_sliding_window == true and type(c.sliding_window) == 'number') then return end
  s.window, s.windowed = pretrained.dim(c, 'sliding_window', where), {}
  local types = type(c.layer_types) == 'table' and c.model_type == 'qwen3' and c.layer_types
  if types and #types ~= s.layers then
    pretrained.refuse(where, 'layer_types', types, ('one per layer, %d'):format(s.layers))
  end
  for i = 1, s.layers do
    if c.model_type == 'qwen3_moe' then s.windowed[i] = true
    elseif types then s.windowed[i] = types[i] == 'sliding_attention'
    else s.windowed[i] = i - 1 >= (c.max_window_layers or 28) end
  end
end

-- Llama's checks (sizes, RoPE, silu, attention_bias on q, k, v and o), then
-- Qwen3's own. Its MLPs have no biases (mlp_bias is no Qwen3 setting).
function F.check(c, where)
  local s = llama.check(c, where)
  s.mlp_bias = nil
  windows(c, s, where)
  if c.model_type == 'qwen3_moe' then moe(c, s, where) end
  return s
end

local Block = nn.block('models.Qwen3Block', function(self, s, i)
  self.input_layernorm = nn.RMSNorm(s.dim, {eps = s.eps})
  self.self_attn = nn.RoPEAttention(s.dim, s.heads, pretrained.attention_options(s.rope, {kv_heads = s.kv_heads,
    head_dim = s.head_dim, qkv_bias = s.qkv_bias, out_bias = s.out_bias, qk_norm = 'head', qk_norm_eps = s.eps,
    sliding_window = s.window and s.windowed[i] and s.window or nil}))
  self.post_attention_layernorm = nn.RMSNorm(s.dim, {eps = s.eps})
  if s.moe and s.sparse[i] then
    self.mlp = nn.MoE(s.dim, s.moe.ffn, s.moe.experts, s.moe.top_k, {norm_topk_prob = s.moe.norm_topk_prob})
  else
    self.mlp = nn.SwiGLU(s.dim, s.ffn)
  end
end)
models.Qwen3Block = Block

Block.hook_names = pretrained.resid_hooks

-- block(x) -> x + attn(norm(x)), then + mlp(norm(.)) (pre-norm, RMSNorm), through the hook points
function Block:forward(x)
  local y = pretrained.prenorm(self, x, self.self_attn, self.input_layernorm, self.mlp, self.post_attention_layernorm)
  return y
end

local Qwen3 = nn.block('models.Qwen3', function(self, s)
  pretrained.decoder_parts(self, s, nn.RMSNorm, Block)
end)
models.Qwen3 = Qwen3

pretrained.decoder(Qwen3, {embed = 'embed_tokens', stack = 'blocks', norm = 'norm', head = 'lm_head'})
-- cached generation: the rotary attention keeps its keys and values and counts the positions
Qwen3.incremental = true
Qwen3.hf_stack = {'blocks', 'model.layers'}  -- models.hf_name: blocks.1 is model.layers.0

-- The checkpoint's settings as print(model) shows them (and the dropout it leaves out)
function Qwen3:extra_repr()
  local s = self.config
  local sparse = 0
  for i = 1, s.layers do if s.moe and s.sparse[i] then sparse = sparse + 1 end end
  return ('%s: vocab=%d, dim=%d, heads=%d, kv_heads=%d, layers=%d, ffn=%d%s, qk_norm'):format(
    s.family, s.vocab, s.dim, s.heads, s.kv_heads, s.layers, s.ffn, s.tied and ', tied head' or '')
    .. (s.moe and (', experts=%d, top_k=%d, moe_ffn=%d on %d layers'):format(s.moe.experts, s.moe.top_k, s.moe.ffn, sparse) or '')
    .. pretrained.config_note(self)
end

function F.build(s) return Qwen3(s) end

-- The parameters build makes from the settings, counted without making them
-- (pretrained.check_size), and the config keys they come from.
F.size_keys = {'num_hidden_layers', 'hidden_size', 'intermediate_size', 'num_attention_heads', 'num_key_value_heads',
  'head_dim', 'vocab_size', 'num_experts', 'num_local_experts', 'moe_intermediate_size'}
function F.parameters(s)
  local C = s.dim
  local hd = s.head_dim or math.floor(C / s.heads)
  local q, kv = s.heads * hd, s.kv_heads * hd  -- widths of q and of each of k, v
  local attn = 2 * C * q + 2 * C * kv + (s.qkv_bias and q + 2 * kv or 0) + (s.out_bias and C or 0) + 2 * hd
  local n = s.vocab * C * (s.tied and 1 or 2) + C
  for i = 1, s.layers do
    local mlp = 3 * C * s.ffn
    if s.moe and s.sparse[i] then mlp = s.moe.experts * 3 * C * s.moe.ffn + C * s.moe.experts end  -- experts, router
    n = n + 2 * C + attn + mlp
  end
  return n
end

-- {anatomy name, Hugging Face name}: Qwen3ForCausalLM prefixes `model.`; a
-- checkpoint of the base Qwen3Model does not. Qwen3-MoE's experts in the Hub's
-- layout (mlp.experts.E.gate_proj/up_proj/down_proj, what save_pretrained
-- writes) or transformers 5's fused one (llama.expert_weights).
function F.weights(s, tensors)
  local prefix = (tensors == nil or tensors['model.embed_tokens.weight'] ~= nil) and 'model.' or ''  -- nil: the layout save_pretrained writes
  local list = {{'embed_tokens.weight', prefix .. 'embed_tokens.weight'}}
  local function add(name, hf, convert) list[#list + 1] = {name, prefix .. hf, convert} end
  for i = 1, s.layers do
    local b, h = 'blocks.' .. i .. '.', 'layers.' .. (i - 1) .. '.'
    add(b .. 'input_layernorm.weight', h .. 'input_layernorm.weight')
    add(b .. 'post_attention_layernorm.weight', h .. 'post_attention_layernorm.weight')
    for _, p in ipairs{'q', 'k', 'v', 'o'} do
      add(b .. 'self_attn.' .. p .. '.weight', h .. 'self_attn.' .. p .. '_proj.weight')
      if (p == 'o' and s.out_bias) or (p ~= 'o' and s.qkv_bias) then
        add(b .. 'self_attn.' .. p .. '.bias', h .. 'self_attn.' .. p .. '_proj.bias')
      end
    end
    add(b .. 'self_attn.q_norm.weight', h .. 'self_attn.q_norm.weight')
    add(b .. 'self_attn.k_norm.weight', h .. 'self_attn.k_norm.weight')
    local parts = {}  -- the SwiGLU's (or each expert's) gate, up and down
    for _, p in ipairs{'gate', 'up', 'down'} do parts[#parts + 1] = {p .. '.weight', p .. '_proj.weight'} end
    if not (s.moe and s.sparse[i]) then
      for _, p in ipairs(parts) do add(b .. 'mlp.' .. p[1], h .. 'mlp.' .. p[2]) end
    elseif tensors and tensors[prefix .. h .. 'mlp.experts.gate_up_proj'] ~= nil then
      llama.expert_weights({moe = s.moe, ffn = s.moe.ffn}, add, b, h, true)
    else
      add(b .. 'mlp.gate.weight', h .. 'mlp.gate.weight')
      for e = 1, s.moe.experts do
        for _, p in ipairs(parts) do add(b .. 'mlp.experts.' .. e .. '.' .. p[1], h .. 'mlp.experts.' .. (e - 1) .. '.' .. p[2]) end
      end
    end
  end
  add('norm.weight', 'norm.weight')
  if not s.tied then list[#list + 1] = {'lm_head.weight', 'lm_head.weight'} end
  return list
end

-- Qwen3-MoE's config settings transformers 5 takes only as floats (save_pretrained writes 0.0, not 0)
F.float_keys = {'router_aux_loss_coef'}

-- Not weights: rotary frequencies some checkpoints keep, a tied head saved anyway.
F.ignored = llama.ignored

return F
