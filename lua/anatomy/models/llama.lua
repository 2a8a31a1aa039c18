-- models.Llama: Hugging Face's Llama family (model_type "llama", "mistral",
-- "qwen2", "mixtral"; SmolLM is "llama") in the library's blocks, for
-- models.from_pretrained. Pre-norm blocks of RMSNorm, nn.RoPEAttention
-- (grouped-query, rotary positions) and nn.SwiGLU (Mixtral: nn.MoE, a
-- sparse mixture of SwiGLU experts); a final RMSNorm; the head
-- tied to the embedding or not. Names follow Hugging Face's, except the stack:
-- blocks.1 is model.layers.0 (`layers` is the method every model has).
local nn = require('anatomy.nn')
local models = require('anatomy.models')
local pretrained = require('anatomy.models.pretrained')

local F = {}

-- The per-expert layout of OLMoE and Qwen3-MoE (mlp.gate, mlp.experts.E.gate_proj, up_proj, down_proj)
F.expert_names = {router = 'mlp.gate', experts = 'mlp.experts.', gate = 'gate_proj', up = 'up_proj', down = 'down_proj'}

-- A sparse MLP's settings (nn.MoE): `key` experts (Mixtral's
-- num_local_experts, OLMoE's num_experts), num_experts_per_tok of them for
-- each token, their weights renormalised unless norm_topk_prob is false;
-- names: where the Hub's per-expert layout keeps them (F.expert_weights).
-- router_jitter_noise scales the block's input by noise in train mode only:
-- anatomy adds none (the same in eval), and print(model) says so as it does of dropout.
local mixtral_names = {router = 'block_sparse_moe.gate', experts = 'block_sparse_moe.experts.', gate = 'w1', up = 'w3', down = 'w2'}
function F.moe(c, where, key, norm_topk_prob, names)
  local m = {experts = pretrained.dim(c, key, where), top_k = pretrained.dim(c, 'num_experts_per_tok', where),
    norm_topk_prob = norm_topk_prob, names = names, jitter = type(c.router_jitter_noise) == 'number' and c.router_jitter_noise or 0}
  if m.top_k > m.experts then
    pretrained.refuse(where, 'num_experts_per_tok', m.top_k, ('more than %s = %d'):format(key, m.experts))
  end
  if c.output_router_logits == true then
    pretrained.refuse(where, 'output_router_logits', true, "transformers then adds the router's auxiliary loss to the loss; anatomy's loss is the language model's")
  end
  return m
end

function F.check(c, where)
  local function dim(key, optional) return pretrained.dim(c, key, where, optional) end
  local s = {
    family = c.model_type, vocab = dim('vocab_size'), dim = dim('hidden_size'), ffn = dim('intermediate_size'),
    layers = dim('num_hidden_layers'), heads = dim('num_attention_heads'),
    eps = c.rms_norm_eps or 1e-6, tied = c.tie_word_embeddings == true,
    positions = dim('max_position_embeddings', true),
  }
  s.kv_heads = dim('num_key_value_heads', true) or s.heads
  s.head_dim = dim('head_dim', true)
  s.rope = pretrained.rope(c, where)
  if s.rope.partial ~= 1 then pretrained.refuse(where, 'partial_rotary_factor', s.rope.partial, 'Llama rotates whole heads') end
  local act = c.hidden_act or 'silu'
  if act ~= 'silu' then pretrained.refuse(where, 'hidden_act', act, 'the SwiGLU MLP gates with silu') end
  if (c.pretraining_tp or 1) ~= 1 then pretrained.refuse(where, 'pretraining_tp', c.pretraining_tp, 'only 1') end
  if c.mlp_bias then s.mlp_bias = true end
  if c.model_type == 'mixtral' then s.moe = F.moe(c, where, 'num_local_experts', true, mixtral_names) end
  -- Llama's attention_bias covers q, k, v and o; Qwen2 has q, k, v biases and none on o.
  if c.model_type == 'qwen2' then
    s.qkv_bias, s.out_bias = true, false
  else
    s.qkv_bias, s.out_bias = c.attention_bias == true, c.attention_bias == true
  end
  -- Sliding windows: Mistral's whenever set, on every layer; Qwen2's only with
  -- use_sliding_window, and then from layer max_window_layers on (counted from
  -- 0). s.windowed[i]: layer i slides (absent: every layer does).
  if (c.model_type == 'mistral' or c.model_type == 'mixtral') and type(c.sliding_window) == 'number' then
    s.window = c.sliding_window
  elseif c.model_type == 'qwen2' and c.use_sliding_window and type(c.sliding_window) == 'number' then
    s.window, s.windowed = c.sliding_window, {}
    for i = 1, s.layers do s.windowed[i] = i >= (c.max_window_layers or 0) + 1 end
  elseif c.model_type == 'llama' and type(c.sliding_window) == 'number' then
    pretrained.refuse(where, 'sliding_window', c.sliding_window, 'Llama attends to every earlier position')
  end
  return s
end

-- F.block(class) -> Llama's pre-norm block under a class name (models.LlamaBlock;
-- Qwen3's is models.Qwen3Block): RMSNorm, nn.RoPEAttention (s.qk_norm on its
-- queries and keys, the sliding window on the layers s.windowed names), RMSNorm,
-- and nn.MoE (experts of s.moe.ffn or s.ffn) on the layers s.sparse names (absent:
-- every layer), else nn.SwiGLU.
function F.block(class)
  return pretrained.prenorm_block(class, pretrained.llama_names, function(self, s, i)
    self.input_layernorm = nn.RMSNorm(s.dim, {eps = s.eps})
    self.self_attn = nn.RoPEAttention(s.dim, s.heads, pretrained.attention_options(s.rope, {kv_heads = s.kv_heads,
      head_dim = s.head_dim, qkv_bias = s.qkv_bias, out_bias = s.out_bias, qk_norm = s.qk_norm, qk_norm_eps = s.qk_norm and s.eps,
      sliding_window = (s.window and (not s.windowed or s.windowed[i])) and s.window or nil}))
    self.post_attention_layernorm = nn.RMSNorm(s.dim, {eps = s.eps})
    if F.sparse(s, i) then
      self.mlp = nn.MoE(s.dim, s.moe.ffn or s.ffn, s.moe.experts, s.moe.top_k, {norm_topk_prob = s.moe.norm_topk_prob})
    else
      self.mlp = nn.SwiGLU(s.dim, s.ffn, {bias = s.mlp_bias})
    end
  end)
end

-- F.sparse(s, i) -> whether layer i's MLP is the mixture of experts
function F.sparse(s, i) return s.moe ~= nil and (not s.sparse or s.sparse[i] == true) end

local Block = F.block('models.LlamaBlock')
models.LlamaBlock = Block

-- F.model(class, Block) -> Llama's decoder class (models.Llama; Qwen3's is
-- models.Qwen3) over the block class Block: embed_tokens, blocks, norm, lm_head
local names = {embed = 'embed_tokens', stack = 'blocks', norm = 'norm', head = 'lm_head'}
function F.model(class, Block) return pretrained.model(class, nn.RMSNorm, Block, names, {stack = 'model.layers'}) end

local Llama = F.model('models.Llama', Block)

-- The checkpoint's settings as print(model) shows them (and the dropout it leaves out)
function Llama:extra_repr()
  local s = self.config
  return ('%s: vocab=%d, dim=%d, heads=%d, kv_heads=%d, layers=%d, ffn=%d%s'):format(
    s.family, s.vocab, s.dim, s.heads, s.kv_heads, s.layers, s.ffn, s.tied and ', tied head' or '')
    .. (s.moe and (', experts=%d, top_k=%d'):format(s.moe.experts, s.moe.top_k) or '') .. pretrained.config_note(self)
    .. ((s.moe and s.moe.jitter > 0) and (', router_jitter_noise=%g not applied: anatomy adds no noise in train mode'):format(s.moe.jitter) or '')
end

function F.build(s) return Llama(s) end

-- The parameters build makes from the settings, counted without making them
-- (pretrained.check_size), and the config keys they come from.
F.size_keys = pretrained.size_keys('num_local_experts', 'num_experts')
function F.parameters(s)
  local C = s.dim
  local q, kv, hd = pretrained.widths(s)  -- widths of q and of each of k, v; the head's
  local attn = 2 * C * q + 2 * C * kv + (s.qkv_bias and q + 2 * kv or 0) + (s.out_bias and C or 0)
    + (s.qk_norm == 'proj' and q + kv or s.qk_norm == 'head' and 2 * hd or 0)  -- q_norm, k_norm
  local mlp = 3 * C * s.ffn + (s.mlp_bias and 2 * s.ffn + C or 0)  -- gate, up, down
  local n = s.vocab * C * (s.tied and 1 or 2) + C
  for i = 1, s.layers do
    local m = mlp
    if F.sparse(s, i) then  -- each expert's, and the router
      m = s.moe.experts * (3 * C * (s.moe.ffn or s.ffn) + (s.mlp_bias and 2 * s.ffn + C or 0)) + C * s.moe.experts
    end
    n = n + 2 * C + attn + m
  end
  return n
end

-- models.llama{vocab, dim, heads, layers, ffn, kv_heads = heads, seq, theta =
-- 10000, tied = false}: a Llama to train from scratch, of the blocks
-- models.from_pretrained builds (RMSNorm, nn.RoPEAttention, nn.SwiGLU).
function F.new(cfg)
  models.check_config('llama', cfg, {'vocab', 'dim', 'heads', 'layers', 'ffn'}, {'kv_heads', 'seq', 'theta', 'tied'})
  local s = F.check({model_type = 'llama', vocab_size = cfg.vocab, hidden_size = cfg.dim, intermediate_size = cfg.ffn,
    num_hidden_layers = cfg.layers, num_attention_heads = cfg.heads, num_key_value_heads = cfg.kv_heads,
    max_position_embeddings = cfg.seq, rope_theta = cfg.theta, tie_word_embeddings = cfg.tied == true}, 'models.llama')
  s.seq = cfg.seq
  return Llama(s)
end

-- {anatomy name, Hugging Face name}: LlamaForCausalLM prefixes `model.`;
-- a checkpoint of the base LlamaModel does not. A layer's two norms are
-- s.norms (OLMo 2's come after attention and MLP), q_norm and k_norm with s.qk_norm.
function F.weights(s, tensors)
  local prefix = (tensors == nil or tensors['model.embed_tokens.weight'] ~= nil) and 'model.' or ''  -- nil: the layout save_pretrained writes
  local list = {{'embed_tokens.weight', prefix .. 'embed_tokens.weight'}}
  local function add(name, hf, convert) list[#list + 1] = {name, prefix .. hf, convert} end
  for i = 1, s.layers do
    local b, h = 'blocks.' .. i .. '.', 'layers.' .. (i - 1) .. '.'
    for _, n in ipairs(s.norms or {'input_layernorm', 'post_attention_layernorm'}) do add(b .. n .. '.weight', h .. n .. '.weight') end
    for _, p in ipairs{'q', 'k', 'v', 'o'} do
      add(b .. 'self_attn.' .. p .. '.weight', h .. 'self_attn.' .. p .. '_proj.weight')
      if (p == 'o' and s.out_bias) or (p ~= 'o' and s.qkv_bias) then
        add(b .. 'self_attn.' .. p .. '.bias', h .. 'self_attn.' .. p .. '_proj.bias')
      end
    end
    if s.qk_norm then
      for _, n in ipairs{'q_norm', 'k_norm'} do add(b .. 'self_attn.' .. n .. '.weight', h .. 'self_attn.' .. n .. '.weight') end
    end
    if F.sparse(s, i) then
      F.expert_weights(s, add, b, h, tensors and tensors[prefix .. h .. 'mlp.experts.gate_up_proj'] ~= nil)
    else
      for _, p in ipairs{'gate', 'up', 'down'} do
        add(b .. 'mlp.' .. p .. '.weight', h .. 'mlp.' .. p .. '_proj.weight')
        if s.mlp_bias then add(b .. 'mlp.' .. p .. '.bias', h .. 'mlp.' .. p .. '_proj.bias') end
      end
    end
  end
  add('norm.weight', 'norm.weight')
  if not s.tied then list[#list + 1] = {'lm_head.weight', 'lm_head.weight'} end
  return list
end

-- A sparse layer's router and experts, in either layout: the Hub's, one
-- tensor per expert under s.moe.names (Mixtral's block_sparse_moe.gate and
-- block_sparse_moe.experts.E.w1 = gate, w3 = up, w2 = down; OLMoE's mlp.gate
-- and mlp.experts.E.gate_proj, up_proj, down_proj; what transformers 5's
-- save_pretrained writes too), or transformers 5's in memory, all experts in
-- one tensor (mlp.experts.gate_up_proj (E, 2 ffn, C), mlp.experts.down_proj
-- (E, C, ffn)), each expert's part cut out. add(name, hf[, convert]) as
-- F.weights; b, h: the layer's prefixes.
function F.expert_weights(s, add, b, h, fused)
  local E, ffn, n = s.moe.experts, s.moe.ffn or s.ffn, s.moe.names
  if not fused then
    add(b .. 'mlp.gate.weight', h .. n.router .. '.weight')
    for e = 1, E do
      local x = h .. n.experts .. (e - 1) .. '.'
      for _, p in ipairs{'gate', 'up', 'down'} do
        add(b .. 'mlp.experts.' .. e .. '.' .. p .. '.weight', x .. n[p] .. '.weight')
      end
    end
    return
  end
  add(b .. 'mlp.gate.weight', h .. 'mlp.gate.weight')
  for e = 1, E do  -- consecutive, so that each fused tensor is read once
    add(b .. 'mlp.experts.' .. e .. '.gate.weight', h .. 'mlp.experts.gate_up_proj', function(t) return t:select(1, e):narrow(1, 1, ffn) end)
    add(b .. 'mlp.experts.' .. e .. '.up.weight', h .. 'mlp.experts.gate_up_proj', function(t) return t:select(1, e):narrow(1, ffn + 1, ffn) end)
  end
  for e = 1, E do
    add(b .. 'mlp.experts.' .. e .. '.down.weight', h .. 'mlp.experts.down_proj', function(t) return t:select(1, e) end)
  end
end

-- Mixtral's config settings transformers 5 takes only as floats (save_pretrained writes 0.0, not 0)
F.float_keys = {'router_jitter_noise', 'router_aux_loss_coef'}

-- Not weights: rotary frequencies some checkpoints keep, a tied head saved anyway.
function F.ignored(name)
  return name:match('rotary_emb%.inv_freq$') ~= nil or name == 'lm_head.weight'
end

return F
