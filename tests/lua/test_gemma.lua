-- Gemma (models/gemma.lua) through the library's tools: TransformerLens's
-- names resolve on Gemma 2's four-norm block and what they hold adds up
-- (resid_mid = resid_pre + attn_out, attn_out the post-norm's output), the
-- embeddings are scaled by √d in their dtype, the final soft-capping is in the
-- readout (so in the logit lens), sliding layers see only their window,
-- cached generation is the uncached one, a fresh model's norms are Gemma's
-- zeros, weight processing keeps Gemma 1's, 2's and 3's probabilities (the
-- pre-norms folded, the post-norms and QK-norms kept, as TransformerLens),
-- and the autopsy gives a row per layer; Gemma 3's
-- multimodal checkpoint loads its language model (both weight layouts, the
-- vision tower passed over by name, no final soft-capping), saves as a
-- gemma3_text one and takes the Hub's sparse text_config. Numbers against
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

test("weight processing keeps Gemma 1's probabilities", function()
  local m, p = model(gemma1), model(gemma1)
  models.process_weights(p, {fold_ln = true, center_unembed = true})
  local ids = torch.randint(1, V + 1, {2, 8})
  close(p(ids):log_softmax(-1), m(ids):log_softmax(-1), 1e-4, 'log-probabilities processed and not')
  close(p.blocks[1].input_layernorm.weight, torch.zeros({24}), 0, 'the norm left at weight 0: a scale of 1')
end)

test("Gemma 2/3: fold_ln folds the pre-norms and keeps the post-norms and QK-norms, as TransformerLens; center_unembed under final soft-capping refused", function()
  local ids = torch.randint(1, V + 1, {2, 8})
  for _, config in ipairs({gemma2, gemma3}) do
    local m, p = model(config), model(config)
    models.process_weights(p, {fold_ln = true})
    close(p(ids), m(ids), 1e-4, config.model_type .. ': logits processed and not')
    local b, o = p.blocks[2], m.blocks[2]
    for _, n in ipairs({'input_layernorm', 'pre_feedforward_layernorm'}) do close(b[n].weight, torch.zeros({24}), 0, n .. ' left at 0: a scale of 1') end
    for _, n in ipairs({'post_attention_layernorm', 'post_feedforward_layernorm'}) do close(b[n].weight, o[n].weight, 0, n .. ' unchanged') end
    local function params(x) local t = {}; for n, w in x:named_parameters() do t[n] = w end; return t end
    local pb, po = params(b), params(o)
    close(pb['self_attn.q.weight'], po['self_attn.q.weight'] * (o.input_layernorm.weight + 1):unsqueeze(1), 1e-6, 'W_Q times 1 + ln1')
    close(pb['mlp.gate.weight'], po['mlp.gate.weight'] * (o.pre_feedforward_layernorm.weight + 1):unsqueeze(1), 1e-6, 'W_gate times 1 + ln2')
    close(weights.embedding(p), p.embed_tokens.weight:double(), 0, "W_E: the embedding's weight, unscaled, as TransformerLens's")
    if config.model_type == 'gemma3_text' then
      close(pb['self_attn.q_norm.weight'], po['self_attn.q_norm.weight'], 0, 'q_norm unchanged')
      close(pb['self_attn.k_norm.weight'], po['self_attn.k_norm.weight'], 0, 'k_norm unchanged')
    end
    H.raises_part(function() models.process_weights(model(config), {fold_ln = true, center_unembed = true}) end,
      'center_unembed: the logits are soft-capped (final_logit_softcapping 0.7)')
  end
  local plain3 = H.merged(gemma3, {})
  plain3.final_logit_softcapping = nil
  local uncapped, centred = model(plain3), model(plain3)
  models.process_weights(centred, {fold_ln = true, center_unembed = true})
  close(centred(ids):log_softmax(-1), uncapped(ids):log_softmax(-1), 1e-4, 'uncapped Gemma 3: log-probabilities processed and not')
end)

test('the autopsy of a Gemma 2: a row per layer, each with its removal loss and lens loss', function()
  torch.manual_seed(4)
  require('family_tests').autopsy_rows(model(gemma2), V, {'blocks.1', 'blocks.2', 'blocks.3'})
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

-- Gemma 3's multimodal folder (model_type gemma3, Gemma3ForConditionalGeneration) by hand: a text model's
-- weights under `prefix` (its untied head as `head`), a vision tower's and a projector's tensors beside them,
-- text_config holding tie_word_embeddings true and the top level false (transformers reads the top level's)
local function multimodal(text, prefix, head)
  local m = model(text)
  torch.no_grad(function() m.lm_head.weight:mul_(50) end)  -- logits a soft-capping at 0.7 would bend
  local plain = H.tmpdir()
  m:save_pretrained(plain)
  local f, tensors = torch.safe_open(plain .. '/model.safetensors'), {
    ['vision_tower.encoder.layers.0.mlp.fc1.weight'] = torch.randn({6, 4}),
    ['multi_modal_projector.mm_input_projection_weight'] = torch.randn({4, 24})}
  for _, name in ipairs(f:keys()) do
    tensors[name == 'lm_head.weight' and head or prefix .. name:sub(#'model.' + 1)] = f:get_tensor(name)
  end
  local dir = H.tmpdir()
  torch.save_safetensors(dir .. '/model.safetensors', tensors, {format = 'pt'})
  local config = {model_type = 'gemma3', architectures = {'Gemma3ForConditionalGeneration'}, tie_word_embeddings = false,
    text_config = H.merged(text, {tie_word_embeddings = true}), vision_config = {model_type = 'siglip_vision_model', hidden_size = 4}}
  require('anatomy.io.fs').write_atomic(dir .. '/config.json', require('anatomy.io.json').encode(config))
  return dir, m
end

test("Gemma 3's multimodal checkpoint: its language model in both layouts, the vision tower left out by name", function()
  local text = H.merged(gemma3, {tie_word_embeddings = false})  -- final_logit_softcapping 0.7, as gemma2's
  local ids = torch.randint(1, V + 1, {2, 7})
  for _, layout in ipairs{{'language_model.model.', 'language_model.lm_head.weight'}, {'model.language_model.', 'lm_head.weight'}} do
    local dir, m = multimodal(text, layout[1], layout[2])
    local mm = models.from_pretrained(dir)
    eq(mm.config.tied, false, layout[1] .. ': the top level tie_word_embeddings false unties the head')
    -- Gemma3ForConditionalGeneration's logits are its head's, not soft-capped
    local capped, cap = m(ids), m.config.final_softcap
    m.config.final_softcap = nil
    local want = m(ids)
    m.config.final_softcap = cap
    assert((capped - want):abs():max():item() > 0.1, 'the soft-capping would move these logits')
    H.identical(mm(ids), want, layout[1] .. ': the logits, uncapped')
    local shown = tostring(mm)
    assert(shown:find("Gemma3ForConditionalGeneration's language model: its vision tower and multi-modal projector not loaded, "
      .. 'final_logit_softcapping 0.7 not applied (as transformers)', 1, true), shown)
  end
end)

test('save_pretrained writes the multimodal model as a gemma3_text checkpoint, read back as it is', function()
  local dir = multimodal(H.merged(gemma3, {tie_word_embeddings = false}), 'language_model.model.', 'language_model.lm_head.weight')
  local mm, out = models.from_pretrained(dir), H.tmpdir()
  mm:save_pretrained(out)
  local json = require('anatomy.io.json')
  local config = json.decode(H.read(out .. '/config.json'))
  eq({config.model_type, config.architectures[1], config.tie_word_embeddings, config.final_logit_softcapping == json.null,
    config.text_config == nil}, {'gemma3_text', 'Gemma3ForCausalLM', false, true, true}, 'the saved config')
  local names = torch.safe_open(out .. '/model.safetensors'):keys()
  table.sort(names)
  eq({names[1], names[#names], #names}, {'lm_head.weight', 'model.norm.weight', 1 + 1 + 3 * 13 + 1}, 'the saved names')
  local again = models.from_pretrained(out)
  local ids = torch.randint(1, V + 1, {1, 9})
  H.identical(again(ids), mm(ids), 'the logits read back')
  -- a vision tensor is passed over in a gemma3 checkpoint only
  local f, tensors = torch.safe_open(out .. '/model.safetensors'), {['vision_tower.x'] = torch.zeros({2})}
  for _, n in ipairs(f:keys()) do tensors[n] = f:get_tensor(n) end
  torch.save_safetensors(out .. '/model.safetensors', tensors, {format = 'pt'})
  H.raises_part(function() models.from_pretrained(out) end, 'the checkpoint has a tensor anatomy does not place: vision_tower.x')
end)

test("the Hub's sparse text_config takes Gemma3TextConfig's defaults; no text_config is refused by name", function()
  local F = require('anatomy.models.gemma')
  -- google/gemma-3-4b-pt's config.json
  local s = F.check({model_type = 'gemma3', text_config = {model_type = 'gemma3_text', hidden_size = 2560, intermediate_size = 10240,
    num_hidden_layers = 34, rope_scaling = {factor = 8.0, rope_type = 'linear'}, sliding_window = 1024}}, 'here')
  eq({s.vocab, s.dim, s.ffn, s.layers, s.heads, s.kv_heads, s.head_dim, s.tied, s.window, s.multimodal},
    {262208, 2560, 10240, 34, 8, 4, 256, true, 1024, true}, 'sizes')
  close(s.scale, 1 / 16, 1e-12, 'query_pre_attn_scalar 256')
  eq({s.types[5], s.types[6], s.types[12], #s.types}, {'sliding_attention', 'full_attention', 'full_attention', 34}, '5:1 pattern')
  eq({s.rope.theta, s.rope.scaling, s.rope.factor, s.rope_local.theta}, {1e6, 'linear', 8, 1e4}, 'RoPE, global and local')
  for _, t in ipairs{false, require('anatomy.io.json').null} do  -- absent, and null
    H.raises_part(function() models.from_config({model_type = 'gemma3', vision_config = {}, text_config = t or nil}) end,
      'config.json has text_config = null, which anatomy does not support')
  end
  H.raises_part(function() models.from_config({model_type = 'gemma3', text_config = H.merged(gemma2, {})}) end,
    'config.json has text_config.model_type = "gemma2", which anatomy does not support')
end)

H.done()
