-- Gemma (models/gemma.lua) through the library's tools: TransformerLens's
-- names resolve on Gemma 2's four-norm block and what they hold adds up
-- (resid_mid = resid_pre + attn_out, attn_out the post-norm's output), the
-- embeddings are scaled by √d in their dtype, the final soft-capping is in the
-- readout (so in the logit lens), sliding layers see only their window,
-- cached generation is the uncached one, a fresh model's norms are Gemma's
-- zeros, weight processing keeps Gemma 1's probabilities and refuses Gemma
-- 2's block by name, and the autopsy gives a row per layer. Numbers against
-- transformers and TransformerLens are tests/parity/test_gemma_parity.py's.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, close = H.test, H.eq, H.close

local V = 40
local gemma2 = {model_type = 'gemma2', vocab_size = V, hidden_size = 24, intermediate_size = 48, num_hidden_layers = 3,
  num_attention_heads = 4, num_key_value_heads = 2, head_dim = 8, max_position_embeddings = 48, sliding_window = 3,
  query_pre_attn_scalar = 12, attn_logit_softcapping = 0.5, final_logit_softcapping = 0.7, attention_dropout = 0.1}
local gemma3 = H.merged(gemma2, {model_type = 'gemma3_text', layer_types = {'sliding_attention', 'full_attention', 'sliding_attention'},
  rope_parameters = {full_attention = {rope_type = 'default', rope_theta = 1e6}, sliding_attention = {rope_type = 'default', rope_theta = 10}}})
local gemma1 = {model_type = 'gemma', vocab_size = V, hidden_size = 24, intermediate_size = 48, num_hidden_layers = 2,
  num_attention_heads = 4, head_dim = 8, max_position_embeddings = 48}

local function model(config, seed)
  local m = models.from_config(config, {seed = seed or 3})
  torch.no_grad(function()  -- norms away from 0, so that a misplaced one shows
    for _, p in m:named_parameters() do
      if p:dim() == 1 then p:add_(torch.randn(p:size()) * 0.3) end
    end
  end)
  return m:eval()
end

test("TransformerLens's names resolve on Gemma 2's four norms, and its stream adds up", function()
  local m = model(gemma2)
  local tl = function(name) return probe.from_transformer_lens(m, name) end
  eq(tl('blocks.0.ln1.hook_normalized'), 'blocks.1.input_layernorm.normalized')
  eq(tl('blocks.0.ln1_post.hook_scale'), 'blocks.1.post_attention_layernorm.scale')
  eq(tl('blocks.1.ln2.hook_normalized'), 'blocks.2.pre_feedforward_layernorm.normalized')
  eq(tl('blocks.2.ln2_post.hook_normalized'), 'blocks.3.post_feedforward_layernorm.normalized')
  eq(tl('blocks.0.hook_attn_out'), 'blocks.1.post_attention_layernorm')
  eq(tl('blocks.0.hook_mlp_out'), 'blocks.1.post_feedforward_layernorm')
  eq(tl('blocks.0.attn.hook_z'), 'blocks.1.self_attn.z')
  eq(tl('hook_embed'), 'embed')
  eq(tl('ln_final.hook_normalized'), 'norm.normalized')
  local ids = torch.randint(1, V + 1, {2, 9})
  local logits, cache = probe.run_with_cache(m, ids)
  close(logits, m(ids), 1e-5, 'logits with every hook point on (each block on its explicit path)')
  local worst = 0
  for l = 0, 2 do
    local b = 'blocks.' .. l .. '.'
    local mid = cache[b .. 'hook_resid_pre'] + cache[b .. 'hook_attn_out']
    worst = math.max(worst, (mid - cache[b .. 'hook_resid_mid']):abs():max():item())
    local post = cache[b .. 'hook_resid_mid'] + cache[b .. 'hook_mlp_out']
    worst = math.max(worst, (post - cache[b .. 'hook_resid_post']):abs():max():item())
    -- GeGLU: the gate through gelu's tanh form, times the up projection
    close(cache[b .. 'mlp.hook_post'], nn.functional.gelu(cache[b .. 'mlp.hook_pre'], {approximate = 'tanh'})
      * cache[('blocks.%d.mlp.pre_linear'):format(l + 1)], 1e-5, b .. 'GeGLU')
  end
  -- decompose_resid's parts (the scaled embedding, each post-norm's output) add up to the stream
  local parts, labels = cache:decompose_resid()
  eq(labels, {'embed', '1_attn_out', '1_mlp_out', '2_attn_out', '2_mlp_out', '3_attn_out', '3_mlp_out'})
  worst = math.max(worst, (parts:sum(1) - cache['blocks.2.hook_resid_post']):abs():max():item())
  assert(worst <= 1e-5, ('resid_mid and resid_post as sums of their parts to %.3g'):format(worst))
  print(('  resid_mid = resid_pre + attn_out, resid_post = resid_mid + mlp_out: largest difference %.3g'):format(worst))
end)

test('the token embeddings are scaled by sqrt(hidden_size), the factor in their dtype', function()
  for _, dtype in ipairs{'float32', 'bfloat16'} do
    local m = model(gemma2)
    m:to(dtype)
    local ids = torch.randint(1, V + 1, {1, 6})
    local rows = m.embed_tokens(ids)
    local want = rows * torch.tensor(math.sqrt(24), {dtype = dtype})  -- 4.899, 4.906 in bfloat16
    H.identical(m:embed(ids), want, dtype .. ': the hidden state block 1 reads')
    local _, cache = probe.run_with_cache(m, ids, {filter = {'embed', 'blocks.1.resid_pre'}})
    H.identical(cache.embed, cache['blocks.1.resid_pre'], dtype .. ': hook point embed')
  end
end)

test('the final soft-capping is in the readout, so in the logit lens', function()
  local m = model(gemma2)
  torch.no_grad(function() m.embed_tokens.weight:mul_(50) end)  -- logits the cap bends
  local h = torch.randn({1, 5, 24})
  local raw = nn.functional.linear(m.norm(h), m:unembedding())
  assert(raw:abs():max():item() > 1.5, 'logits the cap bends')
  close(m:readout(h), (raw / 0.7):tanh() * 0.7, 1e-5, 'readout = 0.7 tanh(W_U norm(h) / 0.7)')
  close(lens.logit(m):readout(2, h), (raw / 0.7):tanh() * 0.7, 1e-5, 'the logit lens reads through it')
  assert(m(torch.randint(1, V + 1, {1, 6})):abs():max():item() < 0.7, 'the logits stay inside the cap')
end)

test("sliding layers see their window alone; Gemma 3's global layer every earlier position", function()
  local m = model(gemma3)
  local _, cache = probe.run_with_cache(m, torch.randint(1, V + 1, {1, 8}), {filter = '*.pattern'})
  for l, sliding in ipairs{true, false, true} do
    local p = cache[('blocks.%d.self_attn.pattern'):format(l)][1]  -- (H, T, T)
    local far = p:narrow(2, 8, 1):narrow(3, 1, 5):abs():max():item()  -- the last query, keys 3 and more back
    if sliding then eq(far, 0, 'layer ' .. l .. ' sees 3 back at most') else assert(far > 0, 'layer 2 sees all') end
  end
  local names = {}
  for n in m:named_parameters() do names[n] = true end
  assert(names['blocks.1.self_attn.q_norm.weight'] and names['blocks.3.self_attn.k_norm.weight'], "Gemma 3's QK-norm weights")
end)

test('cached generation is the uncached one, token for token (windows and soft-capping)', function()
  for _, c in ipairs{{'gemma2', gemma2}, {'gemma3_text', gemma3}, {'gemma', gemma1}} do
    local m = model(c[2])
    local prompt = torch.randint(1, V + 1, {2, 5})
    local full = m:generate(prompt, {max_new = 12, temperature = 0, kv_cache = false})
    H.identical(m:generate(prompt, {max_new = 12, temperature = 0, kv_cache = true}), full, c[1] .. ': greedy tokens')
  end
end)

test("a fresh model's norms are Gemma's zeros (a scale of 1), and its parameters are those the config implies", function()
  local F = require('anatomy.models.gemma')
  for _, c in ipairs{gemma2, gemma3, gemma1, H.merged(gemma2, {tie_word_embeddings = false, attention_bias = true})} do
    local m = models.from_config(c, {seed = 1})
    local n = 0
    for name, p in m:named_parameters() do
      n = n + p:numel()
      if name:match('norm%.weight$') then eq(p:abs():max():item(), 0, name) end
    end
    eq(F.parameters(m.config), n, c.model_type .. ': parameters implied and built')
  end
end)

test("weight processing keeps Gemma 1's probabilities, and refuses Gemma 2's four norms by name", function()
  local m, p = model(gemma1), model(gemma1)
  models.process_weights(p, {fold_ln = true, center_unembed = true})
  local ids = torch.randint(1, V + 1, {2, 8})
  close(p(ids):log_softmax(-1), m(ids):log_softmax(-1), 1e-4, 'log-probabilities processed and not')
  close(p.blocks[1].input_layernorm.weight, torch.zeros({24}), 0, 'the norm left at weight 0: a scale of 1')
  H.raises_part(function() models.process_weights(model(gemma2), {fold_ln = true}) end, 'blocks.1 is not a pre-norm block of two norms')
end)

test('the autopsy of a Gemma 2: a row per layer, each with its removal loss and lens loss', function()
  torch.manual_seed(4)
  local m = model(gemma2)
  local a = autopsy.run(m, {torch.randint(1, V + 1, {2, 8}), torch.randint(1, V + 1, {2, 8})})
  local blocks = {}
  for _, r in ipairs(a.rows) do
    if r.kind == 'block' then
      blocks[#blocks + 1] = r.name
      assert(r.removal_loss == r.removal_loss and r.lens_loss == r.lens_loss, r.name .. ': removal and lens losses are numbers')
    end
  end
  eq(blocks, {'blocks.1', 'blocks.2', 'blocks.3'})
end)

test('print(model) gives the sliding layers, the soft-cappings and the dropout not applied', function()
  local s = tostring(model(gemma2))
  assert(s:find('2 sliding layers (window 3), attention softcap 0.5, final softcap 0.7', 1, true), s)
  assert(s:find('dropout of the checkpoint not applied (attention_dropout=0.1)', 1, true), s)
end)

test('config switches anatomy does not honour are refused by name', function()
  H.raises_part(function() models.from_config(H.merged(gemma3, {use_bidirectional_attention = true})) end,
    'use_bidirectional_attention = true, which anatomy does not support')
  H.raises_part(function() models.from_config(H.merged(gemma2, {layer_types = {'full_attention'}})) end,
    'layer_types = ["full_attention"], which anatomy does not support (one per layer, 3 of them)')
  H.raises_part(function() models.from_config(H.merged(gemma2, {hidden_activation = 'relu'})) end,
    'hidden_activation = "relu", which anatomy does not support')
end)

H.done()
