-- Phi-3 (models/phi3.lua) through the library's tools: the fused qkv_proj and
-- gate_up_proj split at load and joined on save, long RoPE's switch from the
-- short to the long factors where the input passes
-- original_max_position_embeddings (and generation's refill of its cache
-- there), transformers' default attention factor, TransformerLens's names,
-- weight processing and the autopsy's rows. Numbers against transformers are
-- tests/parity/test_phi3_parity.py's.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, close = H.test, H.eq, H.close
local F = require('anatomy.models.phi3')
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')

local V = 40
local config = {model_type = 'phi3', vocab_size = V, hidden_size = 32, intermediate_size = 48, num_hidden_layers = 2,
  num_attention_heads = 4, num_key_value_heads = 2, max_position_embeddings = 64, original_max_position_embeddings = 8,
  rope_parameters = {rope_type = 'longrope', rope_theta = 10000, short_factor = {1, 1.1, 1.3, 1.6}, long_factor = {2, 4, 9, 20}},
  resid_pdrop = 0.1}
local function phi3(extra)
  local m = models.from_config(H.merged(config, extra or {}), {seed = 3})
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

test('qkv_proj and gate_up_proj: joined on save in their order, split again at load', function()
  local m = phi3()
  local dir = H.tmpdir()
  m:save_pretrained(dir)
  local t = torch.load_safetensors(dir .. '/model.safetensors')
  eq(t['model.layers.0.self_attn.q_proj.weight'], nil, 'no unfused q_proj')
  local qkv, gate_up = t['model.layers.1.self_attn.qkv_proj.weight'], t['model.layers.1.mlp.gate_up_proj.weight']
  eq(qkv:size(), {32 + 2 * 16, 32}, 'qkv_proj: q (4 heads of 8), then k and v (2 heads of 8 each)')
  close(qkv, torch.cat({param(m, 'blocks.2.self_attn.q.weight'), param(m, 'blocks.2.self_attn.k.weight'),
    param(m, 'blocks.2.self_attn.v.weight')}, 1), 0, 'q, k, v stacked by rows')
  close(gate_up, torch.cat({param(m, 'blocks.2.mlp.gate.weight'), param(m, 'blocks.2.mlp.up.weight')}, 1), 0, 'gate, then up')
  local back = models.from_pretrained(dir)
  local ids = torch.randint(1, V + 1, {2, 12})
  close(back(ids), m(ids), 0, 'the model read back gives the same logits')
  close(param(back, 'blocks.1.self_attn.k.weight'), param(m, 'blocks.1.self_attn.k.weight'), 0, 'k cut out where it was')
  -- stored in bfloat16 and read as stored (dtype = 'auto'): each part the stored rows, bit for bit
  local t16 = {}
  for name, v in pairs(t) do t16[name] = v:to('bfloat16') end
  torch.save_safetensors(dir .. '/model.safetensors', t16, {format = 'pt'})
  local cfg = json.decode(H.read(dir .. '/config.json'))
  cfg.torch_dtype = 'bfloat16'
  fs.write_atomic(dir .. '/config.json', json.encode(cfg))
  local b16 = models.from_pretrained(dir, {dtype = 'auto'})
  local stored = t16['model.layers.1.mlp.gate_up_proj.weight']
  eq(param(b16, 'blocks.2.mlp.up.weight').dtype, 'bfloat16')
  H.identical(param(b16, 'blocks.2.mlp.up.weight'), stored:narrow(1, 49, 48), 'up: the stored rows 49..96')
  H.identical(param(b16, 'blocks.1.self_attn.v.weight'), t16['model.layers.0.self_attn.qkv_proj.weight']:narrow(1, 49, 16), 'v: rows 49..64')
  -- a fused tensor of the wrong height is refused naming it
  t['model.layers.0.self_attn.qkv_proj.weight'] = t['model.layers.0.self_attn.qkv_proj.weight']:narrow(1, 1, 60):contiguous()
  torch.save_safetensors(dir .. '/model.safetensors', t, {format = 'pt'})
  H.raises_part(function() models.from_pretrained(dir) end,
    'model.layers.0.self_attn.qkv_proj.weight has 60 rows in the checkpoint, expected 64')
end)

test('long RoPE: the long factors from the input that passes original_max_position_embeddings on', function()
  local m = phi3()
  local same = phi3({rope_parameters = H.merged(config.rope_parameters, {long_factor = config.rope_parameters.short_factor})})
  local ids = torch.randint(1, V + 1, {1, 9})
  local short, long = ids:narrow(2, 1, 8), ids
  close(m(short), same(short), 0, '8 positions: the short factors in both')
  local d = (m(long) - same(long)):abs():max():item()
  assert(d > 1e-3, ('9 positions: the long factors, which differ from the short ones (%.3g)'):format(d))
  -- transformers' default attention factor: sqrt(1 + log(64 / 8) / log(8)); given, it is taken as it is
  close(m.config.rope.attention_factor, math.sqrt(1 + math.log(8) / math.log(8)), 1e-12, 'attention factor from the config')
  eq(phi3({rope_parameters = H.merged(config.rope_parameters, {attention_factor = 1.25})}).config.rope.attention_factor, 1.25)
  eq(phi3({max_position_embeddings = 8}).config.rope.attention_factor, 1, 'no extension: 1')
  -- the boundary is the top-level original_max_position_embeddings, 4096 when absent, whatever
  -- rope_parameters says (transformers 5.23's Phi3Config overwrites it there)
  local c = H.merged(config, {rope_parameters = H.merged(config.rope_parameters, {original_max_position_embeddings = 16})})
  eq(models.from_config(c).config.rope.original_max_positions, 8)
  c.original_max_position_embeddings = nil
  eq(models.from_config(c).config.rope.original_max_positions, 4096)
  assert(tostring(m):find('longrope past 8 positions (attention factor 1.414)', 1, true), tostring(m))
end)

test('generation with the cache refills it where the input passes the boundary, and equals generation without', function()
  local m = phi3()
  assert(m:kv_refill(8, 9) and m:kv_refill(5, 9), 'the cache holds short rotations and the next input passes 8')
  assert(not m:kv_refill(9, 10) and not m:kv_refill(5, 8), 'already long, or not yet past')
  assert(not phi3({rope_parameters = {rope_type = 'default'}}):kv_refill(8, 9), 'default RoPE: nothing to refill')
  local prompt = torch.randint(1, V + 1, {1, 5})
  local cached, steps = m:generate(prompt, {max_new = 7, temperature = 0, kv_cache = true, return_cache = {'norm'}})
  local plain = m:generate(prompt, {max_new = 7, temperature = 0, kv_cache = false})
  eq(cached:tolist(), plain:tolist(), 'token for token')
  local read = {}
  for i, c in ipairs(steps) do read[i] = c['norm']:size(2) end
  eq(read, {5, 1, 1, 1, 9, 1, 1}, 'the step that reaches 9 positions reads them all')
  local full = m(cached:narrow(2, 1, 11))
  local last = steps[7]['norm']:select(2, 1)
  close(nn.functional.linear(last, m:unembedding()), full:select(2, 11), 1e-5, "the last step's logits, as without the cache")
end)

test("TransformerLens's names resolve on Phi-3's block, and its stream adds up", function()
  local m = phi3()
  local tl = function(name) return probe.from_transformer_lens(m, name) end
  eq(tl('blocks.0.hook_resid_mid'), 'blocks.1.resid_mid')
  eq(tl('blocks.1.attn.hook_q'), 'blocks.2.self_attn.q')
  eq(tl('blocks.1.attn.hook_rot_k'), 'blocks.2.self_attn.rot_k')
  eq(tl('blocks.0.ln2.hook_normalized'), 'blocks.1.post_attention_layernorm.normalized')
  eq(tl('blocks.0.mlp.hook_post'), 'blocks.1.mlp.post')
  eq(tl('ln_final.hook_normalized'), 'norm.normalized')
  local ids = torch.randint(1, V + 1, {2, 10})
  local logits, cache = probe.run_with_cache(m, ids)
  close(logits, m(ids), 1e-5, 'logits with every hook point on')
  for l = 0, 1 do
    local b = 'blocks.' .. l .. '.'
    close(cache[b .. 'hook_resid_pre'] + cache[b .. 'hook_attn_out'], cache[b .. 'hook_resid_mid'], 1e-5, b .. 'resid_mid')
    close(cache[b .. 'hook_resid_mid'] + cache[b .. 'hook_mlp_out'], cache[b .. 'hook_resid_post'], 1e-5, b .. 'resid_post')
  end
end)

test('weight processing keeps the probabilities; the autopsy gives a row per layer', function()
  local m, p = phi3(), phi3()
  models.process_weights(p, {fold_ln = true, center_unembed = true})
  local ids = torch.randint(1, V + 1, {2, 10})
  close(p(ids):log_softmax(-1), m(ids):log_softmax(-1), 1e-4, 'log-probabilities processed and not')
  close(p.blocks[1].post_attention_layernorm.weight, torch.ones({32}), 0, 'the norm left at weight 1')
  require('family_tests').autopsy_rows(m, V, {'blocks.1', 'blocks.2'}, nil, 10)
end)

test('what anatomy does not honour is refused by name; the parameters a config implies are built', function()
  H.raises_part(function() phi3({hidden_act = 'gelu_new'}) end, 'config.json has hidden_act = "gelu_new", which anatomy does not support')
  H.raises_part(function() phi3({rope_parameters = {rope_type = 'dynamic', factor = 2}}) end,
    'config.json has rope_parameters.rope_type = "dynamic", which anatomy does not support')
  H.raises_part(function() phi3({rope_scaling = {type = 'longrope', short_factor = {1, 1}, long_factor = {1, 1, 1, 1}}}) end,
    'rope_scaling.short_factor = [1,1], which anatomy does not support (longrope needs 4 numbers')
  H.raises_part(function() phi3({partial_rotary_factor = 0.4, rope_parameters = {rope_type = 'default'}}) end,
    'partial_rotary_factor = 0.4, which anatomy does not support (it rotates 3 of 8')
  -- Phi-4-mini's form: partial rotary 0.75 (3 pairs of 8 dims), a tied head, the old 'su' name of longrope
  local m = phi3({partial_rotary_factor = 0.75, tie_word_embeddings = true,
    rope_scaling = {type = 'su', short_factor = {1, 1, 1}, long_factor = {2, 3, 4}}})
  eq(m.config.rotary_dim, 6)
  eq(m.config.rope.scaling, 'longrope')
  eq(m.lm_head, nil, 'tied: no head of its own')
  for _, extra in ipairs{{}, {tie_word_embeddings = true}, {num_key_value_heads = 4}} do
    local b = phi3(extra)
    local n = 0
    for _, p in b:named_parameters() do n = n + p:numel() end
    eq(F.parameters(b.config), n, 'parameters implied and built')
  end
end)

H.done()
