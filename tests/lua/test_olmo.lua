-- OLMo 2 and OLMoE (models/olmo.lua) through the library's tools:
-- TransformerLens's names on OLMo 2's post-norm block (its ln1_post and
-- ln2_post; hook_attn_out and hook_mlp_out their outputs, so that resid_mid
-- = resid_pre + attn_out and resid_post = resid_mid + mlp_out; no ln1, no
-- ln2), cache:decompose_resid summing to the stream, the QK-norm weights
-- over the whole projection in use, weight processing refused for OLMo 2's
-- norms, OLMoE's router logits by TransformerLens's name and its experts
-- weighted without renormalising, the parameters a config implies, and
-- print(model). Numbers against transformers and TransformerLens are
-- tests/parity/test_olmo_parity.py's.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, close = H.test, H.eq, H.close

local V = 40
local base = {vocab_size = V, hidden_size = 32, intermediate_size = 48, num_hidden_layers = 3, num_attention_heads = 4,
  num_key_value_heads = 2, max_position_embeddings = 48, rms_norm_eps = 1e-5}
local function make(extra, seed)
  local m = models.from_config(H.merged(base, extra), {seed = seed or 3})
  torch.no_grad(function()  -- norms away from 1, so that a misplaced one shows
    for _, p in m:named_parameters() do
      if p:dim() == 1 then p:add_(torch.randn(p:size()) * 0.3) end
    end
  end)
  return m:eval()
end
local function olmo2() return make({model_type = 'olmo2'}) end
local function olmoe(extra) return make(H.merged({model_type = 'olmoe', num_experts = 6, num_experts_per_tok = 3}, extra or {})) end

local function param(m, name)
  for n, p in m:named_parameters() do if n == name then return p end end
  error('no parameter ' .. name)
end

test("TransformerLens's names on OLMo 2's block: its norms are ln1_post and ln2_post, after attention and MLP", function()
  local m = olmo2()
  local tl = function(name) return probe.from_transformer_lens(m, name) end
  eq(tl('blocks.0.hook_resid_mid'), 'blocks.1.resid_mid')
  eq(tl('blocks.0.hook_attn_out'), 'blocks.1.post_attention_layernorm')
  eq(tl('blocks.2.hook_mlp_out'), 'blocks.3.post_feedforward_layernorm')
  eq(tl('blocks.0.attn.hook_out'), 'blocks.1.self_attn')
  eq(tl('blocks.0.mlp.hook_out'), 'blocks.1.mlp')
  eq(tl('blocks.1.ln1_post.hook_scale'), 'blocks.2.post_attention_layernorm.scale')
  eq(tl('blocks.1.ln2_post.hook_normalized'), 'blocks.2.post_feedforward_layernorm.normalized')
  eq(tl('blocks.1.ln2_post.hook_out'), 'blocks.2.post_feedforward_layernorm')
  eq(tl('blocks.0.attn.hook_rot_q'), 'blocks.1.self_attn.rot_q')
  H.raises_part(function() tl('blocks.0.ln1.hook_scale') end, 'blocks.1 has no ln1')
  H.raises_part(function() tl('blocks.0.ln2.hook_normalized') end, 'blocks.1 has no ln2')
  local listed = {}
  for _, pair in ipairs(probe.transformer_lens_names(m)) do listed[pair[1]] = pair[2] end
  eq(listed['blocks.0.ln1_post.hook_scale'], 'blocks.1.post_attention_layernorm.scale')
  eq(listed['blocks.2.ln2_post.hook_normalized'], 'blocks.3.post_feedforward_layernorm.normalized')
  eq(listed['blocks.0.ln1.hook_scale'], nil, 'no norm before the attention')
  eq(probe.to_transformer_lens(m, 'blocks.2.post_attention_layernorm'), 'blocks.1.hook_attn_out')
  local points = require('anatomy.probe.points')
  eq(points.output(m, 2, 'mlp'), 'blocks.2.post_feedforward_layernorm', 'what the MLP adds to the stream')
  eq(points.part(m, 2, 'mlp'), 'blocks.2.mlp')
  eq(points.part(m, 2, 'ln1_post'), 'blocks.2.post_attention_layernorm')
end)

test("OLMo 2's stream adds up from the post-norms' outputs, and decompose_resid sums to it", function()
  local m = olmo2()
  local ids = torch.randint(1, V + 1, {2, 9})
  local logits, cache = probe.run_with_cache(m, ids)
  close(logits, m(ids), 1e-5, 'logits with every hook point on (each block on its explicit path)')
  local worst = 0
  for l = 0, 2 do
    local b = 'blocks.' .. l .. '.'
    local mid = cache[b .. 'hook_resid_pre'] + cache[b .. 'hook_attn_out']
    worst = math.max(worst, (mid - cache[b .. 'hook_resid_mid']):abs():max():item())
    worst = math.max(worst, (mid + cache[b .. 'hook_mlp_out'] - cache[b .. 'hook_resid_post']):abs():max():item())
    -- the post-norm reads the attention's output, not the stream
    close(cache[b .. 'hook_attn_out'], m.blocks[l + 1].post_attention_layernorm(cache[b .. 'attn.hook_out']), 1e-5, b .. 'ln1_post(attn out)')
    close(cache[b .. 'ln1_post.hook_scale'], cache[b .. 'attn.hook_out']:pow(2):mean(-1, true):add(1e-5):sqrt(), 1e-5, b .. 'its scale')
  end
  assert(worst <= 1e-5, ('resid_mid = resid_pre + attn_out, resid_post = resid_mid + mlp_out to %.3g'):format(worst))
  print(('  the stream from the post-norms\' outputs: largest difference %.3g'):format(worst))
  local parts, labels = cache:decompose_resid()
  eq(labels, {'embed', '1_attn_out', '1_mlp_out', '2_attn_out', '2_mlp_out', '3_attn_out', '3_mlp_out'})
  close(parts:sum(1), cache['blocks.2.hook_resid_post'], 1e-5, 'the parts sum to the stream after the last layer')
end)

test('the QK-norm is over the whole projection, and its weights are used', function()
  for _, m in ipairs{olmo2(), olmoe()} do
    eq(param(m, 'blocks.1.self_attn.q_norm.weight'):size(), {32}, 'q_norm over heads x head_dim')
    eq(param(m, 'blocks.1.self_attn.k_norm.weight'):size(), {16}, 'k_norm over kv_heads x head_dim')
    -- TransformerLens's hook_q_normed: q normed over the whole projection, as (B, T, H, D) (hook_q's layout)
    local x = torch.randn(1, 7, 32)
    local _, c = probe.run_with_cache(m.blocks[1].self_attn, x)
    local q = nn.functional.linear(x, param(m, 'blocks.1.self_attn.q.weight'))  -- (B, T, H * D), no bias
    local w = param(m, 'blocks.1.self_attn.q_norm.weight')
    close(c['q_normed'], (q * (q:pow(2):mean(-1, true) + 1e-5):rsqrt() * w):reshape(1, 7, 4, 8), 1e-5, 'q_normed over the projection')
    eq(probe.from_transformer_lens(m, 'blocks.0.attn.hook_k_normed'), 'blocks.1.self_attn.k_normed')
    local ids = torch.randint(1, V + 1, {1, 7})
    local before = torch.no_grad(function() return m(ids) end)
    torch.no_grad(function() param(m, 'blocks.1.self_attn.k_norm.weight'):mul_(3) end)
    local after = torch.no_grad(function() return m(ids) end)
    assert((after - before):abs():max():item() > 1e-4, nn.typename(m) .. ': k_norm\'s weight changes the logits')
  end
end)

test("weight processing refuses OLMo 2's norms after attention and MLP, by name", function()
  H.raises_part(function() models.process_weights(olmo2(), {fold_ln = true}) end,
    'blocks.1 normalises its attention\'s and MLP\'s outputs (post_attention_layernorm, post_feedforward_layernorm)')
end)

test("OLMoE: the router logits by TransformerLens's name, each token's experts weighted by their probabilities", function()
  local m = olmoe()
  eq(probe.from_transformer_lens(m, 'blocks.1.mlp.hook_router_logits'), 'blocks.2.mlp.router_logits')
  eq(probe.from_transformer_lens(m, 'blocks.0.ln1.hook_normalized'), 'blocks.1.input_layernorm.normalized')
  eq(m.blocks[1].mlp.norm_topk_prob, false, "OLMoE's norm_topk_prob (false unless the config says)")
  eq(olmoe({norm_topk_prob = true}).blocks[1].mlp.norm_topk_prob, true)
  local ids = torch.randint(1, V + 1, {2, 6})
  local _, cache = probe.run_with_cache(m, ids, {filter = {'blocks.1.mlp.router_logits', 'blocks.1.mlp.expert_out', 'blocks.1.mlp'}})
  local shares = cache['blocks.1.mlp.expert_out']  -- (B, T, E, C)
  close(shares:sum(3), cache['blocks.1.mlp'], 1e-5, "the experts' shares sum to the MLP's output")
  eq(shares:abs():sum(-1):gt(0):sum(-1):max():item(), 3, 'top-3 experts per token')
end)

test('the parameters a config implies are those its model has (pretrained.check_size counts them)', function()
  local F = require('anatomy.models.olmo')
  for _, extra in ipairs{{model_type = 'olmo2'}, {model_type = 'olmo2', attention_bias = true, tie_word_embeddings = true},
                         {model_type = 'olmoe', num_experts = 4, num_experts_per_tok = 2}} do
    local m = models.from_config(H.merged(base, extra))
    local n = 0
    for _, p in m:named_parameters() do n = n + p:numel() end
    eq(F.parameters(m.config), n, extra.model_type .. ': parameters implied and built')
  end
end)

test('print(model) names the family and its experts; clip_qkv and an OLMoE head_dim of its own are refused', function()
  local s = tostring(olmo2())
  assert(s:find('models.Olmo2(olmo2: vocab=40, dim=32, heads=4, kv_heads=2, layers=3, ffn=48)', 1, true), s)
  s = tostring(olmoe())
  assert(s:find('olmoe: vocab=40, dim=32, heads=4, kv_heads=2, layers=3, ffn=48, experts=6, top_k=3', 1, true), s)
  assert(s:find('norm_topk_prob=false', 1, true), s)
  H.raises_part(function() olmoe({clip_qkv = 8}) end, 'config.json has clip_qkv = 8, which anatomy does not support')
  H.raises_part(function() olmoe({head_dim = 16}) end, 'config.json has head_dim = 16, which anatomy does not support')
end)

test('the autopsy of an OLMo 2: a row per layer, each with its removal loss', function()
  torch.manual_seed(4)
  local a = autopsy.run(olmo2(), {torch.randint(1, V + 1, {2, 8}), torch.randint(1, V + 1, {2, 8})})
  local blocks = {}
  for _, r in ipairs(a.rows) do
    if r.kind == 'block' then
      blocks[#blocks + 1] = r.name
      assert(r.removal_loss == r.removal_loss, r.name .. ': the removal loss is a number')
    end
  end
  eq(blocks, {'blocks.1', 'blocks.2', 'blocks.3'})
end)

H.done()
