-- Qwen3 and Qwen3-MoE (models/qwen3.lua) through the library's tools:
-- TransformerLens's names resolve, hook_q being the projection before the
-- per-head norm and rot_q the normed, rotated query; the sparse and dense
-- layers as mlp_only_layers and decoder_sparse_step say, the router's logits
-- by TransformerLens's name; the sliding layers as use_sliding_window,
-- layer_types and max_window_layers say; the parameters a config implies;
-- save_pretrained read back; weight processing; the autopsy's rows; the
-- settings refused by name. Numbers against transformers are
-- tests/parity/test_qwen3_parity.py's.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local json = require('anatomy.io.json')
local test, eq, close = H.test, H.eq, H.close

local V = 40
local dense = {model_type = 'qwen3', vocab_size = V, hidden_size = 32, intermediate_size = 48, num_hidden_layers = 3,
  num_attention_heads = 4, num_key_value_heads = 2, head_dim = 16, max_position_embeddings = 64, rms_norm_eps = 1e-6}
local sparse = H.merged(dense, {model_type = 'qwen3_moe', num_experts = 4, num_experts_per_tok = 2,
  moe_intermediate_size = 24, mlp_only_layers = {1}, norm_topk_prob = false})
local function make(config, extra)
  local m = models.from_config(H.merged(config, extra or {}), {seed = 5})
  torch.no_grad(function()  -- norms away from 1, so that a misplaced one shows
    for _, p in m:named_parameters() do
      if p:dim() == 1 then p:add_(torch.randn(p:size()) * 0.3) end
    end
  end)
  return m:eval()
end

local function param(m, name)
  for n, p in m:named_parameters() do if n == name then return p end end
  error('no parameter ' .. name)
end

local function rms(x, w, eps)
  return x * (x:pow(2):mean(-1, true) + eps):rsqrt() * w
end

test("TransformerLens's names resolve; hook_q is the projection, rot_q its per-head norm (rotated)", function()
  local m = make(dense)
  local tl = function(name) return probe.from_transformer_lens(m, name) end
  eq(tl('blocks.0.hook_resid_pre'), 'blocks.1.resid_pre')
  eq(tl('blocks.1.attn.hook_q'), 'blocks.2.self_attn.q')
  eq(tl('blocks.1.attn.hook_rot_k'), 'blocks.2.self_attn.rot_k')
  eq(tl('blocks.2.mlp.hook_post'), 'blocks.3.mlp.post')
  eq(tl('blocks.0.ln2.hook_normalized'), 'blocks.1.post_attention_layernorm.normalized')
  local ids = torch.randint(1, V + 1, {2, 7})
  local logits, cache = probe.run_with_cache(m, ids)
  close(logits, m(ids), 1e-5, 'logits with every hook point on')
  local h = m.blocks[2].input_layernorm(cache['blocks.1.hook_resid_pre'])
  local q = nn.functional.linear(h, param(m, 'blocks.2.self_attn.q.weight'))  -- (B, T, H * D)
  close(cache['blocks.1.attn.hook_q'], q:reshape(2, 7, 4, 16), 1e-5, 'hook_q: the projection, before the norm')
  -- position 0 is not rotated: rot_q there is the per-head RMSNorm of q times q_norm's weight
  local normed = rms(q:reshape(2, 7, 4, 16), param(m, 'blocks.2.self_attn.q_norm.weight'), 1e-6):select(2, 1)  -- (B, H, D)
  local rot = cache['blocks.1.attn.hook_rot_q']
  local first = rot:size(2) == 7 and rot:select(2, 1) or rot:select(3, 1)  -- (B, T, H, D) or (B, H, T, D)
  close(first, normed, 1e-5, 'rot_q at position 0: q normed over each head')
  -- hook_q_normed / hook_k_normed: after the per-head norm, before rotation (B, T, H, D), at every position
  eq(tl('blocks.0.attn.hook_q_normed'), 'blocks.1.self_attn.q_normed')
  close(cache['blocks.1.attn.hook_q_normed'], rms(q:reshape(2, 7, 4, 16), param(m, 'blocks.2.self_attn.q_norm.weight'), 1e-6), 1e-5, 'hook_q_normed')
  local k = nn.functional.linear(h, param(m, 'blocks.2.self_attn.k.weight')):reshape(2, 7, 2, 16)
  close(cache['blocks.1.attn.hook_k_normed'], rms(k, param(m, 'blocks.2.self_attn.k_norm.weight'), 1e-6), 1e-5, 'hook_k_normed')
  -- hook_pre_linear: the SwiGLU's up projection
  local h2 = m.blocks[2].post_attention_layernorm(cache['blocks.1.hook_resid_mid'])
  close(cache['blocks.1.mlp.hook_pre_linear'], nn.functional.linear(h2, param(m, 'blocks.2.mlp.up.weight')), 1e-5, 'hook_pre_linear')
  -- queries patched to 0 after the norm: every score 0, so the pattern is uniform over the causal window
  local handle = probe.replace(m, 'blocks.0.attn.hook_q_normed', function(t) return t * 0 end)
  local _, patched = probe.run_with_cache(m, ids)
  handle:remove()
  local row = torch.ones(7, 7):tril() / torch.arange(1, 8):float():reshape(7, 1)
  close(patched['blocks.1.self_attn.pattern'], row:reshape(1, 1, 7, 7):expand(2, 4, 7, 7), 1e-6, 'patched q_normed feeds the scores')
end)

test('Qwen3-MoE: nn.MoE on the sparse layers, a SwiGLU of intermediate_size on mlp_only_layers; router logits by their TransformerLens name', function()
  local m = make(sparse)
  eq({nn.typename(m.blocks[1].mlp), nn.typename(m.blocks[2].mlp), nn.typename(m.blocks[3].mlp)}, {'nn.MoE', 'nn.SwiGLU', 'nn.MoE'})
  eq(param(m, 'blocks.2.mlp.gate.weight'):size(), {48, 32}, 'the dense layer: intermediate_size')
  eq(param(m, 'blocks.1.mlp.experts.1.gate.weight'):size(), {24, 32}, 'each expert: moe_intermediate_size')
  eq(m.blocks[1].mlp.norm_topk_prob, false, 'norm_topk_prob as the config says')
  eq(probe.from_transformer_lens(m, 'blocks.2.mlp.hook_router_logits'), 'blocks.3.mlp.router_logits')
  -- the bridge's MoE names: hook_pre and hook_post the MoE's input and output, its router's gate.hook_out and top-k
  local tl = function(name) return probe.from_transformer_lens(m, name) end
  eq({tl('blocks.0.mlp.hook_pre'), tl('blocks.0.mlp.hook_post'), tl('blocks.0.mlp.gate.hook_out'), tl('blocks.0.mlp.hook_expert_weights'),
      tl('blocks.0.mlp.gate.hook_expert_indices'), tl('blocks.1.mlp.hook_pre'), tl('blocks.1.mlp.hook_pre_linear')},
     {'blocks.1.mlp.input', 'blocks.1.mlp', 'blocks.1.mlp.router_logits', 'blocks.1.mlp.expert_weights', 'blocks.1.mlp.expert_indices',
      'blocks.2.mlp.pre', 'blocks.2.mlp.pre_linear'})
  eq(probe.to_transformer_lens(m, 'blocks.1.mlp'), 'blocks.0.hook_mlp_out', 'the MoE output spelt hook_mlp_out, not its alias')
  H.raises_part(function() return tl('blocks.1.mlp.hook_expert_weights') end, 'anatomy has no counterpart of it')  -- the dense layer
  H.raises_part(function() return probe.from_transformer_lens(models.from_config(H.merged(dense, {model_type = 'llama', head_dim = nil}), {seed = 1}),
    'blocks.0.attn.hook_q_normed') end, 'blocks.1.self_attn has no QK-norm (qk_norm)')
  local ids = torch.randint(1, V + 1, {2, 6})
  local _, cache = probe.run_with_cache(m, ids, {filter = {'*.router_logits'}})
  eq(cache['blocks.3.mlp.router_logits']:size(), {2, 6, 4})
  H.raises_part(function() return cache['blocks.2.mlp.router_logits'] end, 'matches no probe point')  -- the dense layer
  local steps = make(sparse, {mlp_only_layers = {}, decoder_sparse_step = 2})
  eq({nn.typename(steps.blocks[1].mlp), nn.typename(steps.blocks[2].mlp), nn.typename(steps.blocks[3].mlp)},
     {'nn.SwiGLU', 'nn.MoE', 'nn.SwiGLU'}, 'decoder_sparse_step 2: layers 2, 4, ... (counted from 1)')
  local none = make(sparse, {num_experts = 0})
  eq(nn.typename(none.blocks[1].mlp), 'nn.SwiGLU', 'num_experts 0: every layer dense, as transformers')
  local s = tostring(m)
  assert(s:find('experts=4, top_k=2, moe_ffn=24 on 2 layers', 1, true), s)
  assert(s:find('qk_norm', 1, true), s)
end)

test('sliding windows: only with use_sliding_window; layer_types, else from max_window_layers; every layer in Qwen3-MoE', function()
  local function windows(m)
    local out = {}
    for i, b in ipairs(m.blocks) do out[i] = rawget(b.self_attn, '_made_with').sliding_window or 0 end
    return out
  end
  eq(windows(make(dense, {sliding_window = 4})), {0, 0, 0}, 'without use_sliding_window: none')
  eq(windows(make(dense, {use_sliding_window = true, sliding_window = 4, max_window_layers = 1})), {0, 4, 4})
  eq(windows(make(dense, {use_sliding_window = true, sliding_window = 4, max_window_layers = 1,
    layer_types = {'sliding_attention', 'full_attention', 'sliding_attention'}})), {4, 0, 4}, 'layer_types first')
  eq(windows(make(sparse, {use_sliding_window = true, sliding_window = 4, max_window_layers = 2})), {4, 4, 4})
  -- a window of 4 in a one-layer model: the last position does not see the first token
  local one = make(dense, {num_hidden_layers = 1, use_sliding_window = true, sliding_window = 4, max_window_layers = 0})
  local ids = torch.randint(1, V + 1, {1, 8})
  local other = ids:clone()
  other[1][1] = ids[1][1] % V + 1
  close(one(other):select(2, 8), one(ids):select(2, 8), 0, 'position 8 does not see position 1')
  assert((one(other):select(2, 4) - one(ids):select(2, 4)):abs():max():item() > 0, 'position 4 does')
end)

test('the parameters a config implies are those its model has (pretrained.check_size counts them)', function()
  local F = require('anatomy.models.qwen3')
  for _, c in ipairs{dense, H.merged(dense, {attention_bias = true, tie_word_embeddings = true}), sparse,
                     H.merged(sparse, {decoder_sparse_step = 2, mlp_only_layers = {}})} do
    local m = models.from_config(c)
    local n = 0
    for _, p in m:named_parameters() do n = n + p:numel() end
    eq(F.parameters(m.config), n, c.model_type .. ': parameters implied and built')
  end
end)

test('saved and read back the same; the experts as transformers writes them; num_experts or num_local_experts', function()
  for _, c in ipairs{dense, sparse} do
    local m = make(c, {attention_bias = true})
    local dir = H.tmpdir()
    m:save_pretrained(dir)
    local back = models.from_pretrained(dir)
    local ids = torch.randint(1, V + 1, {2, 6})
    H.identical(back(ids), m(ids), c.model_type .. ' read back')
    if c.model_type == 'qwen3_moe' then
      local names = torch.safe_open(dir .. '/model.safetensors'):keys()
      local has = {}
      for _, n in ipairs(names) do has[n] = true end
      assert(has['model.layers.0.mlp.experts.3.down_proj.weight'] and has['model.layers.0.mlp.gate.weight'], 'per-expert layout')
      assert(has['model.layers.1.mlp.up_proj.weight'] and not has['model.layers.1.mlp.gate.weight'], 'the dense layer')
      assert(has['model.layers.0.self_attn.q_norm.weight'] and has['model.layers.0.self_attn.o_proj.bias'], 'q_norm, o bias')
    end
  end
  local renamed = H.merged(sparse, {num_experts = json.null, num_local_experts = 3})
  eq(make(renamed).blocks[1].mlp.num_experts, 3, "transformers 5's num_local_experts")
end)

test('weight processing keeps the probabilities of a Qwen3 and a Qwen3-MoE', function()
  local m, p = make(dense), make(dense)
  models.process_weights(p, {fold_ln = true, center_unembed = true})
  local ids = torch.randint(1, V + 1, {2, 8})
  close(p(ids):log_softmax(-1), m(ids):log_softmax(-1), 1e-4, 'log-probabilities processed and not')
  close(p.blocks[1].input_layernorm.weight, torch.ones({32}), 0, 'the norm left at weight 1')
  local s, q = make(sparse), models.process_weights(make(sparse), {fold_ln = true, center_unembed = true})
  close(q(ids):log_softmax(-1), s(ids):log_softmax(-1), 1e-4, 'Qwen3-MoE: log-probabilities processed and not')
end)

test('the autopsy of a Qwen3-MoE: a row per layer, each with its removal loss and lens loss', function()
  torch.manual_seed(4)
  local a = autopsy.run(make(sparse), {torch.randint(1, V + 1, {2, 8}), torch.randint(1, V + 1, {2, 8})})
  local blocks = {}
  for _, r in ipairs(a.rows) do
    if r.kind == 'block' then
      blocks[#blocks + 1] = r.name
      assert(r.removal_loss == r.removal_loss and r.lens_loss == r.lens_loss, r.name .. ': removal and lens losses are numbers')
    end
  end
  eq(blocks, {'blocks.1', 'blocks.2', 'blocks.3'})
end)

test('settings anatomy does not honour are refused by name', function()
  local cases = {
    {sparse, {output_router_logits = true}, 'output_router_logits = true, which anatomy does not support'},
    {sparse, {num_experts_per_tok = 5}, 'num_experts_per_tok = 5, which anatomy does not support (more than num_experts = 4)'},
    {sparse, {mlp_only_layers = {3}}, 'mlp_only_layers = [3], which anatomy does not support (layer numbers from 0 to 2)'},
    {sparse, {moe_intermediate_size = json.null}, 'config.json needs a number moe_intermediate_size'},
    {dense, {use_sliding_window = true, sliding_window = 4, layer_types = {'full_attention'}}, 'layer_types = ["full_attention"], which anatomy does not support (one per layer, 3)'},
    {dense, {hidden_act = 'gelu'}, 'hidden_act = "gelu", which anatomy does not support'},
  }
  for _, c in ipairs(cases) do
    H.raises_part(function() models.from_config(H.merged(c[1], c[2])) end, c[3])
  end
end)

H.done()
