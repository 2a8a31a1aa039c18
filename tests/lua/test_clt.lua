-- sae.CLT: cross-layer transcoders and per-layer sets compute circuit-
-- tracer's formulas; circuit-tracer's folders are written and read back
-- (and bad ones refused by name); sae.train_clt lowers the loss and a
-- resumed run ends bit for bit where the unstopped one does; spliced in with
-- the error terms the logits are the clean ones, and ablating the error
-- terms or a feature changes them; bad options and mismatched models are
-- errors naming the function, the argument and the closest name.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, close, raises, raises_part = H.test, H.eq, H.close, H.raises, H.raises_part
local fs = require('anatomy.io.fs')

torch.manual_seed(0)
local corpus = data.from_string(('the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs. '):rep(60))
local model = models.gpt{vocab = corpus.vocab_size, dim = 16, heads = 2, layers = 3, seq = 16, ffn = 32}
train.fit(model, corpus, {steps = 30, batch = 8, seq = 16, quiet = true})
model:eval()
local quick = {width = 32, steps = 40, batch = 128, seq = 16, sequences = 8, quiet = true, warmup = 4, log_every = 10}
local function with(t, extra) return H.merged(t, extra) end
local ids = corpus:tokens('val'):narrow(1, 1, 24):view(2, 12):to(model:device())

local randomize = H.randomize_transcoders  -- random weights everywhere, thresholds around the pre-activations' scale

-- every layer's reconstruction written out: b_dec[m] + Σ_{l ≤ m} f_l W_dec_l[:, m − l] (+ x_m W_skip[m]ᵀ)
local function formula(c, f, x)
  local outs = {}
  for m = 1, c.cfg.n_layers do
    local want = c.b_dec[m]
    for l = 1, m do
      local W = c:decoder(l)
      if m - l < W:size(2) then want = want + f:select(-2, l):matmul(W:select(2, m - l + 1)) end
    end
    if c.W_skip then want = want + x:select(-2, m):matmul(c.W_skip[m]:t()) end
    outs[m] = want
  end
  return torch.stack(outs, -2)
end

test("each kind's features are circuit-tracer's: x W_encᵀ + b_enc, then ReLU, pre · [pre > θ], or each layer's top k", function()
  local x = torch.randn(4, 5, 3, 8)
  for _, kind in ipairs{'relu', 'jumprelu', 'topk'} do
    local c = randomize(sae.clt{n_layers = 3, d_model = 8, d_transcoder = 10, kind = kind, k = kind == 'topk' and 3 or nil}, 1)
    local pre = torch.stack({x:select(-2, 1):matmul(c.W_enc[1]:t()) + c.b_enc[1], x:select(-2, 2):matmul(c.W_enc[2]:t()) + c.b_enc[2],
      x:select(-2, 3):matmul(c.W_enc[3]:t()) + c.b_enc[3]}, -2)
    local want
    if kind == 'relu' then want = pre:relu()
    elseif kind == 'jumprelu' then want = pre * pre:gt(c.threshold):float()
    else
      local kth = pre:topk(3, -1):narrow(-1, 3, 1)
      want = pre:masked_fill(pre:lt(kth), 0):relu()
    end
    local f = c:encode(x)
    close(f, want, 1e-6, kind .. ' features')
    close(c:decode(f), formula(c, f, x), 1e-5, kind .. ' reconstruction of every layer')
    if kind == 'topk' then eq(f:gt(0):sum(-1):le(3):all():item(), true, 'at most k features a layer') end
    for l = 1, 3 do close(c:encode_layer(x:select(-2, l), l), f:select(-2, l), 1e-6, 'encode_layer ' .. l) end
  end
  -- a negative threshold lets negative pre-activations through, as circuit-tracer's JumpReLU does
  local c = sae.clt{n_layers = 3, d_model = 8, d_transcoder = 10, threshold = -10}
  eq(c:encode(x):lt(0):any():item(), true, 'negative features above a negative threshold')
  -- a per-layer set writes to its own layer alone; its skip adds x W_skipᵀ
  local s = randomize(sae.clt{n_layers = 3, d_model = 8, d_transcoder = 10, kind = 'relu', cross_layer = false, skip = true}, 2)
  eq(s:decoder(2):size(2), 1)
  local f = s:encode(x)
  close(s:decode(f, x), formula(s, f, x), 1e-5, 'a set with skip')
  raises(function() s:decode(f) end, 'clt:decode: these transcoders have a skip (W_skip): give the MLP inputs x too')
end)

test("circuit-tracer's folders: written, read back the same, and damaged ones refused by name", function()
  local dir = H.tmpdir()
  local x = torch.randn(6, 3, 8)
  local c = randomize(sae.clt{n_layers = 3, d_model = 8, d_transcoder = 10}, 3)
  c:save(dir .. '/clt')
  for i = 0, 2 do
    eq(fs.exists(('%s/clt/W_enc_%d.safetensors'):format(dir, i)) and fs.exists(('%s/clt/W_dec_%d.safetensors'):format(dir, i)), true)
  end
  local t = torch.load_safetensors(dir .. '/clt/W_dec_1.safetensors')
  eq(t.W_dec_1:size(), {10, 2, 8}, 'W_dec_1 is (F, L - 1, D)')
  local e = torch.load_safetensors(dir .. '/clt/W_enc_2.safetensors')
  eq(e.W_enc_2:size(), {10, 8}); eq(e.threshold_2:size(), {10})
  eq(H.read(dir .. '/clt/config.yaml'):find('model_kind: "cross_layer_transcoder"', 1, true) ~= nil, true)
  local back = sae.load_clt(dir .. '/clt')
  eq(back.cfg.kind, 'jumprelu'); eq(back.cfg.input_hook, 'ln2.hook_normalized'); eq(back.cfg.cross_layer, true)
  H.identical(back:decode(back:encode(x)), c:decode(c:encode(x)), 'a CLT read back')
  local s = randomize(sae.clt{n_layers = 3, d_model = 8, d_transcoder = 10, kind = 'relu', cross_layer = false, skip = true}, 4)
  s:save(dir .. '/set')
  local l1 = torch.load_safetensors(dir .. '/set/layer_1.safetensors')
  eq(l1.W_dec:size(), {10, 8}); eq(l1.W_skip:size(), {8, 8}); eq(l1['activation_function.threshold'], nil)
  local sback = sae.load_clt(dir .. '/set', {input_hook = 'mlp.hook_in'})
  eq(sback.cfg.kind, 'relu'); eq(sback.cfg.skip, true); eq(sback.cfg.input_hook, 'mlp.hook_in')
  H.identical(sback:decode(sback:encode(x), x), s:decode(s:encode(x), x), 'a set with skip read back')
  -- config.yaml as circuit-tracer's Hub folders write it names the hooks; a model_kind the files contradict is refused
  local f = io.open(dir .. '/set/config.yaml', 'w')
  f:write('model_kind: transcoder_set\nfeature_input_hook: hook_resid_mid\nfeature_output_hook: mlp.hook_out\n'); f:close()
  local hooked = sae.load_clt(dir .. '/set')
  eq(hooked.cfg.input_hook, 'hook_resid_mid'); eq(hooked.cfg.output_hook, 'mlp.hook_out')
  f = io.open(dir .. '/set/config.yaml', 'w'); f:write('model_kind: cross_layer_transcoder\n'); f:close()
  raises(function() sae.load_clt(dir .. '/set') end,
    ('sae.load_clt: %s/set/config.yaml says model_kind cross_layer_transcoder; its files are a transcoder_set'):format(dir))
  f = io.open(dir .. '/set/config.yaml', 'w'); f:write('feature_input_hook: [1, 2\n'); f:close()
  raises(function() sae.load_clt(dir .. '/set') end, ("sae.load_clt: '%s/set/config.yaml': line 2, column 1: end of sequence flow not found"):format(dir))
  os.remove(dir .. '/set/config.yaml')
  raises(function() sae.clt{n_layers = 3, d_model = 8, d_transcoder = 10, kind = 'topk'}:save(dir .. '/topk') end,
    "clt:save: circuit-tracer's transcoders are ReLU or JumpReLU; a TopK one has no form in its files (train kind = 'jumprelu' or 'relu')")
  -- damaged: a decoder of the wrong shape, a missing decoder, an empty folder, a file that is not safetensors
  torch.save_safetensors(dir .. '/clt/W_dec_1.safetensors', {W_dec_1 = torch.zeros(10, 3, 8)})
  raises(function() sae.load_clt(dir .. '/clt') end,
    ('sae.load_clt: %s/clt/W_dec_1.safetensors: W_dec_1 has shape 10x3x8, expected 10x2x8'):format(dir))
  os.remove(dir .. '/clt/W_dec_1.safetensors')
  raises(function() sae.load_clt(dir .. '/clt') end,
    ('sae.load_clt: %s/clt has W_enc_1.safetensors but no W_dec_1.safetensors'):format(dir))
  fs.mkdir(dir .. '/empty')
  raises_part(function() sae.load_clt(dir .. '/empty') end, 'holds neither W_enc_0.safetensors (a cross-layer transcoder) nor layer_0.safetensors')
  f = io.open(dir .. '/set/layer_2.safetensors', 'wb'); f:write('not safetensors'); f:close()
  raises_part(function() sae.load_clt(dir .. '/set') end, 'sae.load_clt: ')
  raises(function() sae.load_clt(dir .. '/none') end,
    ("sae.load_clt: '%s/none' is neither a folder nor a Hub reference ('org/name[/subfolder][@revision]')"):format(dir))
end)

test('sae.train_clt lowers the loss of every kind; a set trains too', function()
  for _, kind in ipairs{'jumprelu', 'relu', 'topk'} do
    local c, h = sae.train_clt(model, corpus, with(quick, {kind = kind, k = kind == 'topk' and 4 or nil}))
    eq(c.cfg.n_layers, 3); eq(c.cfg.d_model, 16); eq(c.cfg.d_transcoder, 32)
    eq(h.loss[#h.loss] < 0.7 * h.loss[1], true, ('%s: loss %.4f at step 10, %.4f at 40'):format(kind, h.loss[1], h.loss[#h.loss]))
    eq(h.explained_variance[#h.explained_variance] > h.explained_variance[1], true, kind .. ': explained variance rises')
  end
  -- dead features are counted per layer and feature: none within 10^9 rows, some (k = 2 of 64) within one batch
  local topk = with(quick, {kind = 'topk', k = 2, width = 64, steps = 20})
  local c1, h1 = sae.train_clt(model, corpus, with(topk, {dead_after = 1e9}))
  local c2, h2 = sae.train_clt(model, corpus, with(topk, {dead_after = 128}))
  eq(c1.since_fired:size(), {3, 64}); eq(h1.dead[#h1.dead], 0)
  eq(h2.dead[#h2.dead] > 0, true, 'dead within one batch: ' .. h2.dead[#h2.dead])
  eq(c2.since_fired:min():item(), 0, 'the features of the last batch fired')
  -- the activation cache: every layer's rows written once, read back by the next run, refused for other hooks
  local cache = H.tmpdir() .. '/acts'
  local a = sae.train_clt(model, corpus, with(quick, {steps = 10, cache = cache}))
  local b = sae.train_clt(model, corpus, with(quick, {steps = 10, cache = cache}))
  eq(b.cfg.trained.rows_from_model, 0); eq(b.cfg.trained.rows_from_cache, a.cfg.trained.rows_from_model)
  H.identical(b.W_enc, a.W_enc, 'a CLT trained from the cache')
  raises(function() sae.train_clt(model, corpus, with(quick, {cache = cache, input_hook = 'hook_resid_mid'})) end,
    ('sae.train_clt: the activation cache %s was written for point = transcoders: ln2.hook_normalized -> hook_mlp_out; '
    .. 'this run has transcoders: hook_resid_mid -> hook_mlp_out (another folder, or remove it)'):format(cache))
  local s, h = sae.train_clt(model, corpus, with(quick, {kind = 'relu', cross_layer = false, skip = true}))
  eq(s.cfg.cross_layer, false); eq(s.W_skip:abs():sum():item() > 0, true, 'the skip learns')
  eq(h.loss[#h.loss] < h.loss[1], true)
end)

test('a resumed run ends with the weights, bit for bit, of the run that was not stopped', function()
  local dir = H.tmpdir()
  local base = with(quick, {kind = 'topk', k = 4, buffer = 300, dead_after = 200})
  local whole = sae.train_clt(model, corpus, base)
  local part = sae.train_clt(model, corpus, with(base, {steps = 17, checkpoint = dir .. '/17.safetensors'}))
  eq(part.cfg.trained.steps, 17)
  local resumed, h = sae.train_clt(model, corpus, with(base, {resume = dir .. '/17.safetensors'}))
  for name, p in whole:named_parameters() do H.identical(resumed[name], p, name .. ' after a resume') end
  eq(resumed.cfg.trained.resumed_at, 17)
  eq(h.step, {10, 17, 20, 30, 40})
  raises(function() sae.train_clt(model, corpus, with(base, {k = 5, resume = dir .. '/17.safetensors'})) end,
    'sae.train_clt: resume: the checkpoint was trained with k = 4, this run has 5')
  raises(function() sae.train_clt(model, corpus, with(base, {cross_layer = false, resume = dir .. '/17.safetensors'})) end,
    'sae.train_clt: resume: the checkpoint was trained with cross_layer = true, this run has false')
  local jr = with(quick, {kind = 'jumprelu', buffer = 300})
  local a = sae.train_clt(model, corpus, jr)
  sae.train_clt(model, corpus, with(jr, {steps = 23, checkpoint = dir .. '/23.safetensors'}))
  local b = sae.train_clt(model, corpus, with(jr, {resume = dir .. '/23.safetensors'}))
  for name, p in a:named_parameters() do H.identical(b[name], p, 'jumprelu ' .. name .. ' after a resume') end
end)

test('spliced in with the error terms the logits are the clean ones; ablating the errors or a feature changes them; removed, nothing stays', function()
  local clean = model(ids)
  local c = sae.train_clt(model, corpus, with(quick, {kind = 'jumprelu'}))
  local h = sae.attach(model, c, {error_term = true})
  local diff = (model(ids) - clean):abs():max():item()
  print(('  spliced with error terms: max |dlogit| %.3g'):format(diff))
  eq(diff <= 1e-5, true, 'max |dlogit| ' .. diff)
  -- the features the splice computes are the CLT's of the clean MLP inputs
  local _, cache = probe.run_with_cache(model, ids, {filter = {'blocks.*.mlp.clt.acts'}})
  -- attached again (a notebook cell run twice), or an SAE on one of its MLP outputs: refused, nothing added
  local n = #probe.list(model)
  H.raises_part(function() sae.attach(model, c, {error_term = true}) end, 'already has an SAE spliced in')
  eq(#probe.list(model), n, 'the refused second left nothing attached')
  h:remove()
  local inputs = {}
  local rec = {}
  for l = 1, 3 do
    rec[l] = probe.replace(model, 'blocks.' .. l .. '.mlp', function(_, _, input) inputs[l] = input end)
  end
  model(ids)
  for l = 1, 3 do rec[l]:remove() end
  close(cache['blocks.2.mlp.clt.acts'], c:encode(torch.stack(inputs, -2)):select(-2, 2), 1e-6, 'layer 2 features')
  h = sae.attach(model, c, {error_term = true})
  local zero = {}
  for l = 1, 3 do zero[l] = probe.replace(model, 'blocks.' .. l .. '.mlp.clt.error', function(t) return torch.zeros_like(t) end) end
  local no_errors = model(ids)
  probe.group(zero):remove()
  local ablated_feature = probe.replace(model, 'blocks.1.mlp.clt.acts', function(t) return torch.zeros_like(t) end)
  local without_layer1 = model(ids)
  ablated_feature:remove()
  h:remove()
  local d_err, d_feat = (no_errors - clean):abs():max():item(), (without_layer1 - clean):abs():max():item()
  print(('  error terms ablated: max |dlogit| %.3g; layer 1 features ablated: %.3g'):format(d_err, d_feat))
  eq(d_err > 1e-3, true, 'ablating the error terms changes the logits')
  eq(d_feat > 1e-3, true, "ablating layer 1's features changes the logits")
  -- without error terms: each MLP output is its reconstruction, as probe.replace with the CLT written out gives
  h = sae.attach(model, c)
  local spliced = model(ids)
  h:remove()
  local by_hand, xs, fs_ = {}, {}, {}
  for l = 1, 3 do
    by_hand[l] = probe.replace(model, 'blocks.' .. l .. '.mlp', function(_, _, input)
      xs[l] = input
      fs_[l] = c:encode_layer(input, l)
      return c:decode_layer(fs_, l, input)
    end)
  end
  close(model(ids), spliced, 1e-5, 'the splice without error terms')
  for l = 1, 3 do by_hand[l]:remove() end
  H.identical(model(ids), clean, 'removed: the clean logits')
  eq(#probe.list(model), 0, 'nothing attached')
  -- a per-layer set splices the same way
  local s = sae.train_clt(model, corpus, with(quick, {kind = 'relu', cross_layer = false}))
  h = sae.attach(model, s, {error_term = true})
  local d_set = (model(ids) - clean):abs():max():item()
  h:remove()
  eq(d_set <= 1e-5, true, 'a set spliced: ' .. d_set)
end)

test("every family: a CLT trains on its MLPs' inputs and outputs (after a post-MLP norm where it has one) and splices in exactly", function()
  -- (six steps: whether the loss falls is the test above's; here, what is read and replaced)
  local outputs, inputs = {}, {}
  for _, pair in ipairs(H.family_models(corpus.vocab_size, 8)) do
    local name, m = pair[1], pair[2]
    m:eval()
    local c, h = sae.train_clt(m, corpus, {width = 16, steps = 6, batch = 64, seq = 16, sequences = 4, quiet = true, warmup = 1})
    eq(h.loss[#h.loss] == h.loss[#h.loss] and h.loss[#h.loss] < math.huge, true, name .. ': a finite loss ' .. h.loss[#h.loss])
    local x = ids:narrow(2, 1, 8)
    local plain = m(x)
    -- the clean run reading the same points: an RMSNorm's normalized vectors (ln2.hook_normalized) are
    -- computed unfused where they are read, within float rounding of the fused norm
    local locs = require('anatomy.features.clt_splice').locations(m, c, 'test', 1)
    local watch = {}
    for l, loc in ipairs(locs) do watch[l] = probe.replace(m, loc.input, function() end) end
    local clean = m(x)
    probe.group(watch):remove()
    close(clean, plain, 1e-5, name .. ': the clean run reading the inputs')
    local handle = sae.attach(m, c, {error_term = true})
    H.identical(m(x), clean, name .. ': spliced with error terms')
    handle:remove()
    handle = sae.attach(m, c)
    eq((m(x) - clean):abs():max():item() > 1e-3, true, name .. ': without error terms the logits move')
    handle:remove()
    outputs[name:match('^%S+')] = locs[2].output
    inputs[name:match('^%S+')] = locs[2].input
  end
  -- TransformerLens 2's ln2.hook_normalized (circuit-tracer's): a LayerNorm's output, an RMSNorm's vectors before its weight
  eq(inputs.gpt2, 'h.2.mlp')
  eq(inputs.llama, 'blocks.2.post_attention_layernorm.normalized')
  eq(outputs.gemma2, 'blocks.2.post_feedforward_layernorm', "Gemma 2's hook_mlp_out: after its post-MLP norm")
  eq(outputs.llama, 'blocks.2.mlp')
end)

test('bad options, widths and layer counts are errors naming the function, the argument and the closest name', function()
  raises(function() sae.clt{n_layers = 3, d_model = 8, d_transcoder = 10, kind = 'jumprelo'} end,
    "sae.clt: kind must be 'jumprelu', 'relu' or 'topk', got jumprelo (did you mean 'jumprelu'?)")
  raises_part(function() sae.clt{n_layer = 3, d_model = 8, d_transcoder = 10} end, "sae.clt: unknown option 'n_layer', did you mean 'n_layers'?")
  raises(function() sae.clt{n_layers = 3, d_model = 8} end,
    'sae.clt: d_transcoder is needed (n_layers, d_model, d_transcoder: layers, width, features a layer)')
  raises(function() sae.clt{n_layers = 3, d_model = 8, d_transcoder = 10, input_hook = 'hook_resid_md'} end,
    "sae.clt: input_hook must be one of hook_resid_mid, ln2.hook_normalized, mlp.hook_in, got hook_resid_md (did you mean 'hook_resid_mid'?)")
  raises(function() sae.clt{n_layers = 3, d_model = 8, d_transcoder = 10, skip = true} end,
    "sae.clt: skip is for per-layer transcoders (cross_layer = false): circuit-tracer's cross-layer files hold no W_skip")
  raises(function() sae.clt{n_layers = 3, d_model = 8, d_transcoder = 10, kind = 'topk', k = 11} end,
    'sae.clt: k must be at most d_transcoder 10, got 11')
  raises(function() sae.clt{n_layers = 3, d_model = 8, d_transcoder = 10, k = 2} end, "sae.clt: k is for kind 'topk', not 'jumprelu'")
  local c = sae.clt{n_layers = 3, d_model = 8, d_transcoder = 10}
  raises(function() c:encode(torch.ones(4, 2, 8)) end, 'clt:encode: x must end in (n_layers, d_model) = (3, 8), got shape 4x2x8')
  raises(function() c:decode(torch.ones(4, 3, 8)) end, 'clt:decode: f must end in (n_layers, d_transcoder) = (3, 10), got shape 4x3x8')
  -- the model: its layer count, then its width at the first forward
  raises(function() sae.attach(model, sae.clt{n_layers = 2, d_model = 16, d_transcoder = 10}) end,
    'sae.attach: the transcoders have 2 layers, the model 3')
  local h = sae.attach(model, c)
  raises_part(function() model(ids) end, "sae.attach: the input of layer 1 at 'blocks.1.mlp' is 16 wide; the transcoders' d_model is 8")
  h:remove()
  raises(function() sae.attach(model, sae.clt{n_layers = 3, d_model = 16, d_transcoder = 10}, {error_trem = true}) end,
    "sae.attach: unknown option 'error_trem', did you mean 'error_term'? (expected error_term)")
  raises_part(function() sae.train_clt(model, corpus, {step = 5}) end, "sae.train_clt: unknown option 'step', did you mean 'steps'?")
  raises_part(function() sae.train_clt(model, corpus, {point = 'blocks.1.mlp'}) end, "sae.train_clt: unknown option 'point'")
  raises(function() sae.train_clt(model, corpus, {kind = 'batchtopk'}) end,
    "sae.train_clt: kind must be 'jumprelu', 'relu' or 'topk', got batchtopk")
  raises(function() sae.train_clt(model, corpus, {output_hook = 'hook_mlp_ot'}) end,
    "sae.train_clt: output_hook must be one of hook_mlp_out, mlp.hook_out, got hook_mlp_ot (did you mean 'hook_mlp_out'?)")
  raises(function() sae.train_clt(model, corpus, {skip = true}) end,
    "sae.train_clt: skip is for per-layer transcoders (cross_layer = false): circuit-tracer's cross-layer files hold no W_skip")
  -- every option's error is at the caller's line
  for _, bad in ipairs{{steps = 1.5}, {width = 0}, {kind = 'gated'}, {cross_layer = 'yes'}, {tanh_c = -1}, {input_hook = 3}} do
    local ok, err = pcall(function() sae.train_clt(model, corpus, bad) end)
    local key = next(bad)
    eq(ok, false, key)
    eq(tostring(err):match('^[^:]*test_clt%.lua:%d+: sae%.train_clt: ') ~= nil, true, key .. ': ' .. tostring(err))
  end
end)

H.done()
