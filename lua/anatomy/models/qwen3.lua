-- models.Qwen3: Hugging Face's Qwen3 and Qwen3-MoE (model_type "qwen3",
-- "qwen3_moe") for models.from_pretrained, as Llama's model, block, parameter
-- count and weight names (models/llama.lua) with Qwen3's settings: an RMSNorm
-- over each head's queries and keys before the rotation (qk_norm = 'head'),
-- its sliding layers (s.windowed), and, in Qwen3-MoE, nn.MoE of
-- moe_intermediate_size in the MLP's place on every decoder_sparse_step-th
-- layer not in mlp_only_layers (s.sparse; the others: a SwiGLU of
-- intermediate_size). Names follow Hugging Face's, except the stack: blocks.1
-- is model.layers.0.
local models = require('anatomy.models')
local pretrained = require('anatomy.models.pretrained')
local llama = require('anatomy.models.llama')

local F = {}

-- Qwen3-MoE's experts: num_experts (transformers 5 writes num_local_experts) of
-- moe_intermediate_size, num_experts_per_tok of them per token, renormalised only
-- where norm_topk_prob (false unless set), checked as Mixtral's and OLMoE's
-- (llama.moe), in OLMoE's per-expert layout. s.sparse[i]: layer i's MLP is the MoE.
local function moe(c, s, where)
  local experts = type(c.num_local_experts) == 'number' and 'num_local_experts' or 'num_experts'
  if c[experts] == 0 then return end  -- transformers: no sparse layer
  local m = llama.moe(c, where, experts, c.norm_topk_prob == true, llama.expert_names)
  m.ffn = pretrained.dim(c, 'moe_intermediate_size', where)
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
  s.mlp_bias, s.qk_norm = nil, 'head'
  windows(c, s, where)
  if c.model_type == 'qwen3_moe' then moe(c, s, where) end
  return s
end

-- Llama's block and model under Qwen3's class names
local Block = llama.block('models.Qwen3Block')
models.Qwen3Block = Block
local Qwen3 = llama.model('models.Qwen3', Block)

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
F.size_keys = pretrained.size_keys('num_experts', 'num_local_experts', 'moe_intermediate_size')
F.parameters = llama.parameters

-- {anatomy name, Hugging Face name}: Llama's (llama.weights), with q_norm and
-- k_norm, and Qwen3-MoE's experts in the Hub's layout (mlp.experts.E.gate_proj,
-- up_proj, down_proj: what save_pretrained writes) or transformers 5's fused one.
F.weights = llama.weights

-- Qwen3-MoE's config settings transformers 5 takes only as floats (save_pretrained writes 0.0, not 0)
F.float_keys = {'router_aux_loss_coef'}

-- Not weights: rotary frequencies some checkpoints keep, a tied head saved anyway.
F.ignored = llama.ignored

return F
