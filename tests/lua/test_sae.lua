-- sae: an SAE computes the formulas of its kind; training is reproducible,
-- learns and tracks dead features; spliced in with the error term the model
-- is unchanged bit for bit, without it CE loss recovered is the ratio of
-- losses measured independently; features are hook points that captures,
-- replacements and probe.clear see; transcoders replace a module's output;
-- the activation cache is read back, and refused for another model; the top
-- contexts are the largest activations; the autopsy carries the SAE's
-- numbers; bad input is an error naming the function and the argument.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, close, raises, raises_part = H.test, H.eq, H.close, H.raises, H.raises_part
local fs = require('anatomy.io.fs')

torch.manual_seed(0)
local corpus = data.from_string(('the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs. '):rep(60))
local model = models.gpt{vocab = corpus.vocab_size, dim = 16, heads = 2, layers = 2, seq = 16, ffn = 32}
train.fit(model, corpus, {steps = 30, batch = 8, seq = 16, quiet = true})
model:eval()
local POINT = 'blocks.1.resid_post'
local quick = {point = POINT, steps = 40, batch = 128, width = 48, seq = 16, sequences = 8, quiet = true}
local function with(t, extra)
  local out = {}
  for k, v in pairs(t) do out[k] = v end
  for k, v in pairs(extra or {}) do out[k] = v end
  return out
end

test('each kind computes its formula: pre = (x - b_dec) W_enc + b_enc, then ReLU, top-k, or the jump at the threshold', function()
  torch.manual_seed(1)
  local x = torch.randn(5, 7, 6)
  for _, kind in ipairs{'relu', 'topk', 'jumprelu', 'batchtopk'} do
    local s = sae.new{d_in = 6, d_sae = 10, kind = kind, k = (kind == 'topk' or kind == 'batchtopk') and 3 or nil}
    torch.no_grad(function()
      s.b_enc:copy_(torch.randn(10) * 0.3); s.b_dec:copy_(torch.randn(6) * 0.3)
      if s.threshold then s.threshold:fill_(0.4) end
    end)
    local pre = (x - s.b_dec):matmul(s.W_enc) + s.b_enc
    local want
    if kind == 'relu' then want = pre:relu()
    elseif kind == 'topk' then
      local kth = pre:topk(3, -1):narrow(-1, 3, 1)  -- the third largest of each row
      want = pre:masked_fill(pre:lt(kth), 0):relu()
    else want = pre:masked_fill(pre:le(0.4), 0) end
    local f = s:encode(x)
    close(f, want, 1e-6, kind .. ' features')
    close(s:decode(f), f:matmul(s.W_dec) + s.b_dec, 1e-6, kind .. ' reconstruction')
    if kind == 'topk' then eq(f:gt(0):sum(-1):le(3):all():item(), true, 'at most k features per row') end
    local r, g = s(x)
    close(r, s:decode(f), 0); close(g, f, 0)
  end
end)

test('rescaling the decoder rows to unit norm keeps every reconstruction', function()
  torch.manual_seed(2)
  local s = sae.new{d_in = 6, d_sae = 10, kind = 'jumprelu'}
  torch.no_grad(function()
    s.W_dec:copy_(torch.randn(10, 6) * 3); s.threshold:fill_(0.5); s.b_enc:copy_(torch.randn(10))
  end)
  local x = torch.randn(20, 6)
  local before = s:decode(s:encode(x))
  s:normalize_decoder()
  close(s.W_dec:norm(2, -1), torch.ones(10), 1e-6)
  close(s:decode(s:encode(x)), before, 1e-5)
end)

test('training: the same seed gives the same SAE; the loss falls; top-k keeps L0 at k; dead features are counted', function()
  local a, ha = sae.train(model, corpus, with(quick, {k = 4}))
  local b = sae.train(model, corpus, with(quick, {k = 4}))
  H.identical(a.W_enc, b.W_enc, 'W_enc of two runs with one seed')
  H.identical(a.W_dec, b.W_dec, 'W_dec of two runs with one seed')
  local c = sae.train(model, corpus, with(quick, {k = 4, seed = 2}))
  eq(torch.equal(a.W_enc, c.W_enc), false, 'another seed, another SAE')
  eq(ha.loss[#ha.loss] < ha.loss[1], true, 'the loss falls')
  eq(ha.l0[#ha.l0], 4)
  eq(a.cfg.trained.rows, 40 * 128)
  eq(a.cfg.trained.sequences, 8, 'the settings it ran with are kept, defaults included')
  eq(a.cfg.trained.aux_coefficient, 1 / 32)
  close(a.W_dec:norm(2, -1), torch.ones(48), 1e-5, 'unit-norm decoder rows')
  eq(a.since_fired:size(), {48})
  for _, kind in ipairs{'relu', 'jumprelu', 'batchtopk'} do
    local s, h = sae.train(model, corpus, with(quick, {kind = kind, k = kind == 'batchtopk' and 4 or nil}))
    eq(h.loss[#h.loss] < h.loss[1], true, kind .. ': the loss falls')
    eq(s.cfg.kind, kind)
  end
end)

-- The windows sae.evaluate reads: consecutive (T + 1)-token stretches of the val split.
local function windows(T, n)
  local ids = corpus:tokens('val'):to(model:device())  -- fed to the model directly: on its device
  n = math.min(n, math.floor((ids:numel() - 1) / T))
  return ids:narrow(1, 1, n * T):view(n, T), ids:narrow(1, 2, n * T):view(n, T)
end

test('with the error term the logits are the clean ones exactly; CE loss recovered is the ratio of the three losses', function()
  local s = sae.train(model, corpus, with(quick, {k = 4}))
  local x, y = windows(16, 8)
  local clean = model(x)
  local h = sae.attach(model, s, {error_term = true})
  H.identical(model(x), clean, 'logits with the SAE and its error term')
  eq(tostring(h), 'probe handle: SAE at blocks.1.resid_post attached (handle:remove() takes it out)')
  -- attached again (a notebook cell run twice): the second would read the first's reconstruction
  H.raises_part(function() sae.attach(model, s) end,
    "sae.attach: blocks.1.resid_post already has an SAE spliced in, and a second would read the first's reconstruction")
  eq(#probe.list(model), 1, 'the refused second left nothing attached')
  h:remove()
  eq(tostring(h), 'probe handle: nothing attached (removed, or cleared by probe.clear)')
  local e = sae.evaluate(model, s, corpus, {batches = 1, batch = 8, seq = 16})
  local function loss(fn)
    local handle = fn and probe.replace(model, POINT, fn)
    local l = nn.functional.cross_entropy(model(x), y):item()
    if handle then handle:remove() end
    return l
  end
  local l_clean = loss()
  local l_spliced = loss(function(t) return s:decode(s:encode(t)) end)
  local l_zero = loss(function(t) return torch.zeros_like(t) end)
  close(e.ce_clean, l_clean, 1e-6); close(e.ce_spliced, l_spliced, 1e-6); close(e.ce_zero, l_zero, 1e-6)
  close(e.ce_recovered, (l_zero - l_spliced) / (l_zero - l_clean), 1e-6)
  -- explained variance and L0 from the cached activations
  local _, cache = probe.run_with_cache(model, x, {filter = {POINT}})
  local acts = cache[POINT]:reshape({-1, 16})
  local f = s:encode(acts)
  local err = (s:decode(f) - acts):square():sum():item()
  local var = (acts - acts:mean(1)):square():sum():item()
  close(e.explained_variance, 1 - err / var, 1e-5)
  close(e.l0, f:gt(0):float():sum(-1):mean():item(), 1e-6)
  eq(e.tokens, acts:size(1))
  eq(tostring(e):match('^sae.evaluate at blocks.1.resid_post over 128 tokens') ~= nil, true)
end)

test('features are hook points: cached, replaced (the output moves by the change of the reconstruction), cleared', function()
  local s = sae.train(model, corpus, with(quick, {k = 4}))
  local x = windows(16, 2)
  local h = sae.attach(model, s, {error_term = true})
  local _, cache = probe.run_with_cache(model, x, {filter = {POINT, POINT .. '.sae.acts', POINT .. '.sae.error'}})
  local acts = cache[POINT .. '.sae.acts']
  eq(acts:size(), {2, 16, 48})
  local _, clean_cache = probe.run_with_cache(model, x, {filter = {POINT}})
  close(acts, s:encode(clean_cache[POINT]), 1e-6)
  close(cache[POINT .. '.sae.error'], clean_cache[POINT] - s:decode(acts), 1e-6)
  local busiest = acts:gt(0):float():sum(1):sum(1):view(-1):argmax():item()
  local zero = probe.replace(model, POINT .. '.sae.acts', function(f)
    local g = f:clone(); g:select(3, busiest):zero_(); return g
  end)
  local _, edited = probe.run_with_cache(model, x, {filter = {POINT}})
  zero:remove()
  local g = acts:clone(); g:select(3, busiest):zero_()
  close(edited[POINT], s:decode(g) + cache[POINT .. '.sae.error'], 1e-5)
  eq((edited[POINT] - clean_cache[POINT]):abs():max():item() > 1e-3, true, 'zeroing a busy feature changes the point')
  eq(probe.canonical(model, POINT .. '.sae.acts'), POINT .. '.sae.acts')
  probe.clear(model)
  eq(probe.canonical(model, POINT .. '.sae.acts'), nil, 'the features are gone with the SAE')
  h:remove()  -- after probe.clear, harmless
end)

test('features compose with patching, attribution patching and steering, given the layer that has them', function()
  local s = sae.train(model, corpus, with(quick, {k = 4}))
  local x = windows(16, 2)
  local y = x:clone(); y:narrow(2, 1, 6):copy_(x:narrow(2, 7, 6))
  local target = x:select(2, 16):unsqueeze(2)
  local function metric(l) return l:select(2, 15):log_softmax(-1):gather(2, target):mean() end
  local ACTS = POINT .. '.sae.acts'
  local h = sae.attach(model, s, {error_term = true})
  -- without layers, every layer is asked for a point one layer has
  raises_part(function() patching.run(model, x, y, function(l) return metric(l):item() end, {over = 'resid_post.sae.acts'}) end,
    "no module or hook point named 'blocks.2.resid_post.sae.acts'")
  raises_part(function() patching.attribute(model, x, y, metric, {over = 'resid_post.sae.acts'}) end, '{layers = ...}')
  raises_part(function() patching.run(model, x, y, metric, {over = 'resid_post', layers = 3}) end, 'layer must be in 1..2, got 3')
  -- exact patching of every feature: the corrupt run with the clean run's features in their place
  local r = patching.run(model, x, y, function(l) return metric(l):item() end, {over = 'resid_post.sae.acts', layers = {1}})
  eq(r.rows, {'blocks.1'})
  local _, clean_cache = probe.run_with_cache(model, x, {filter = {ACTS}})
  local swap = probe.replace(model, ACTS, function() return clean_cache[ACTS] end)
  local want = metric(model(y)):item()
  swap:remove()
  close(r.grid[1][1]:item(), want, 1e-6, 'patching.run over the features = the corrupt run with the clean features')
  -- attribution per feature: one cell a feature, summing to the layer's estimate
  local per_feature = patching.attribute(model, x, y, metric, {over = 'resid_post.sae.acts', per = 'neuron', layers = 'blocks.1'})
  local whole = patching.attribute(model, x, y, metric, {over = 'resid_post.sae.acts', layers = 'blocks.1'})
  eq(per_feature.grid:size(), {1, 48})
  close(per_feature.grid:sum():item(), whole.grid[1][1]:item(), 1e-4, 'the features\' cells add up to the layer')
  eq(per_feature.grid:abs():max():item() > 1e-6, true, 'some feature moves the metric')
  -- a steering vector over the features: the mean difference of the cached features, added through the decoder
  local v = steer.vector(model, {x[1]}, {y[1]}, {point = 'resid_post.sae.acts', layers = {1}})
  local _, cx = probe.run_with_cache(model, x:narrow(1, 1, 1), {filter = {ACTS}})
  local _, cy = probe.run_with_cache(model, y:narrow(1, 1, 1), {filter = {ACTS}})
  close(v.vectors['blocks.1'], cx[ACTS]:mean(2):view(-1) - cy[ACTS]:mean(2):view(-1), 1e-6, 'the features\' mean difference')
  local clean = model(x)
  local steered = steer.apply(model, v, {coefficient = 4})
  local _, moved = probe.run_with_cache(model, x, {filter = {POINT, ACTS}})
  steered:remove()
  local _, base = probe.run_with_cache(model, x, {filter = {POINT, ACTS}})
  close(moved[POINT] - base[POINT], s:decode(base[ACTS] + v.vectors['blocks.1'] * 4) - s:decode(base[ACTS]), 1e-5,
    'steering the features moves the point by the decoded change')
  H.identical(model(x), clean, 'the steering removed')
  h:remove()
end)

test('a transcoder reads an MLP input and replaces its output by the reconstruction', function()
  local t = sae.train(model, corpus, with(quick, {point = 'blocks.2.mlp', transcoder = true, k = 8, steps = 200}))
  eq(t.cfg.apply_b_dec_to_input, false, "a transcoder's b_dec is the output's")
  eq(t.cfg.transcoder, true)
  local x = windows(16, 2)
  local got_in, got_out
  local rec = probe.replace(model, 'blocks.2.mlp', function(y, _, input) got_in, got_out = input, y end)
  local clean = model(x)
  rec:remove()
  local h = sae.attach(model, t)
  local _, cache = probe.run_with_cache(model, x, {filter = {'blocks.2.mlp'}})
  h:remove()
  close(cache['blocks.2.mlp'], t:decode(t:encode(got_in)), 1e-5)
  local h2 = sae.attach(model, t, {error_term = true})
  H.identical(model(x), clean, 'a transcoder with its error term')
  h2:remove()
  local e = sae.evaluate(model, t, corpus, {batches = 1, batch = 4, seq = 16})
  eq(e.explained_variance > 0.3, true, 'a transcoder explains its MLP output: ' .. tostring(e.explained_variance))
  local _ = got_out
end)

test('a run resumed from its checkpoint ends with the SAE of the run that was not stopped', function()
  local dir = H.tmpdir()
  local base = with(quick, {kind = 'batchtopk', k = 4, buffer = 300, warmup = 4, log_every = 10})
  local whole = sae.train(model, corpus, base)
  -- the first 17 steps of the same run (the learning rate depends on the step alone), checkpointed
  local part = sae.train(model, corpus, with(base, {steps = 17, checkpoint = dir .. '/17.safetensors'}))
  eq(part.cfg.trained.steps, 17)
  local resumed, h = sae.train(model, corpus, with(base, {resume = dir .. '/17.safetensors'}))
  H.identical(resumed.W_enc, whole.W_enc, 'W_enc after a resume')
  H.identical(resumed.W_dec, whole.W_dec, 'W_dec after a resume')
  H.identical(resumed.threshold, whole.threshold, 'the BatchTopK threshold after a resume')
  eq(resumed.cfg.trained.resumed_at, 17)
  eq(h.step, {10, 17, 20, 30, 40})
  raises(function() sae.train(model, corpus, with(base, {k = 5, resume = dir .. '/17.safetensors'})) end,
    'sae.train: resume: the checkpoint was trained with k = 4, this run has 5')
  raises(function() sae.train(model, corpus, with(base, {resume = dir .. '/none.safetensors'})) end,
    "sae.train: resume: no file '" .. dir .. "/none.safetensors'")
end)

test('the activation cache is read back by the next run (the model not rerun), and refused for other weights', function()
  local dir = H.tmpdir() .. '/acts'
  local a = sae.train(model, corpus, with(quick, {k = 4, cache = dir}))
  eq(a.cfg.trained.rows_from_model > 0, true); eq(a.cfg.trained.rows_from_cache, 0)
  eq(fs.exists(dir .. '/manifest.json'), true)
  local b = sae.train(model, corpus, with(quick, {k = 4, cache = dir}))
  eq(b.cfg.trained.rows_from_model, 0); eq(b.cfg.trained.rows_from_cache, a.cfg.trained.rows_from_model)
  H.identical(b.W_enc, a.W_enc, 'an SAE trained from the cache')
  local other = models.gpt{vocab = corpus.vocab_size, dim = 16, heads = 2, layers = 2, seq = 16, ffn = 32}
  raises_part(function() sae.train(other, corpus, with(quick, {cache = dir})) end, 'sae.train: the activation cache ' .. dir .. ' was written for weights_sha256')
  -- two rows of a weight swapped: every count and sum as before, other activations (the cache once keyed
  -- the weights by their count and sum of absolute values, and took this model's)
  local sd = model:state_dict()
  local w = sd['blocks.1.mlp.fc.weight']:clone()
  w:narrow(1, 1, 1):copy_(sd['blocks.1.mlp.fc.weight']:narrow(1, 2, 1))
  w:narrow(1, 2, 1):copy_(sd['blocks.1.mlp.fc.weight']:narrow(1, 1, 1))
  sd['blocks.1.mlp.fc.weight'] = w
  local swapped = models.gpt{vocab = corpus.vocab_size, dim = 16, heads = 2, layers = 2, seq = 16, ffn = 32}
  swapped:load_state_dict(sd)
  raises_part(function() sae.train(swapped, corpus, with(quick, {cache = dir})) end, 'was written for weights_sha256')
end)

test('the top contexts are the largest activations of each feature, largest first, the token marked', function()
  local s = sae.train(model, corpus, with(quick, {k = 4}))
  local r = sae.top_activations(model, s, corpus, {features = {1, 5}, k = 3, batches = 1, batch = 8, seq = 16, context = 4})
  local x = windows(16, 8)
  local _, cache = probe.run_with_cache(model, x, {filter = {POINT}})
  local f = s:encode(cache[POINT])  -- (8, 16, 48)
  for _, feature in ipairs{1, 5} do
    local all = f:select(3, feature):reshape({-1})
    local top = all:topk(3):tolist()
    local list = r[feature]
    for i, c in ipairs(list) do
      close(c.value, top[i], 1e-5, ('feature %d, context %d'):format(feature, i))
      close(f[c.row][c.position][feature]:item(), c.value, 1e-5)
      eq(c.token, corpus:decode(x[c.row]:narrow(1, c.position, 1)))
    end
    eq(#list, math.min(3, all:gt(0):sum():item()))
    eq(r.counts[feature], all:gt(0):sum():item())
    -- the histogram holds every nonzero activation the count counts (under its cap): one number, not three
    eq(#r.values[r:index(feature)], r.counts[feature])
    -- a context near its window's start shows what came before it in the text, outside the window
    for _, c in ipairs(list) do
      if c.row > 1 and c.position <= 4 then
        local flat = x:reshape(-1)
        local start = (c.row - 1) * 16
        eq(c.before_window, corpus:decode(flat:narrow(1, start - (4 - (c.position - 1)) + 1, 4 - (c.position - 1))))
      end
    end
  end
  local page = r:page(1)
  assert(page:find(('all %d of its nonzero activations'):format(r.counts[1]), 1, true), 'the histogram says it holds them all')
  -- a context longer than the window reaches into the text before it (which the model did not read), marked
  local wide = sae.top_activations(model, s, corpus, {features = {1}, k = 3, batches = 1, batch = 8, seq = 16, context = 20})
  local checked = 0
  for _, c in ipairs(wide[1]) do
    if c.row > 1 then
      local need = 20 - (c.position - 1)
      eq(c.before_window, corpus:decode(x:reshape(-1):narrow(1, (c.row - 1) * 16 - need + 1, need)))
      checked = checked + 1
    end
  end
  assert(checked > 0 or #wide[1] == 0, 'a context from a later window')
  if checked > 0 then assert(tostring(wide):find('¦', 1, true), 'print marks the window start') end
  eq(tostring(r):find('«', 1, true) ~= nil, true)
  local html = r:page(1)
  eq(html:find('Top ' .. #r[1] .. ' contexts', 1, true) ~= nil, true)
  eq(html:find('promotes', 1, true) ~= nil, true)
  raises(function() r:page(2) end, 'r:page: feature 2 was not among those scanned (2 of them)')
  -- in a notebook: the same page inline, the feature's own contexts as text
  local bundle = r:feature(1):_repr_mimebundle()
  eq(bundle['text/html']:find('Top ' .. #r[1] .. ' contexts', 1, true) ~= nil, true, 'the page inline')
  eq(bundle['text/plain']:match('^top activations at ') ~= nil, true)
  eq(bundle['text/plain']:find('feature 1:', 1, true) ~= nil, true)
  eq(bundle['text/plain']:find('feature ' .. r.features[2] .. ':', 1, true), nil, 'only the feature asked for')
end)

test('the autopsy with saes: the layer\'s row carries what sae.evaluate measures', function()
  local s = sae.train(model, corpus, with(quick, {k = 4}))
  local a = autopsy.run(model, corpus, {saes = {s}, batch = 4, seq = 16, metrics = {'grad_norm', 'erank'}})
  local e = sae.evaluate(model, s, corpus, {batches = 1, batch = 4, seq = 16})
  local row
  for _, r in ipairs(a.rows) do if r.name == 'blocks.1' then row = r end end
  close(row.sae_l0, e.l0, 1e-9); close(row.sae_ev, e.explained_variance, 1e-9); close(row.sae_ce_recovered, e.ce_recovered, 1e-9)
  eq(row.sae_alive, 48 - math.floor(e.dead * 48 + 0.5))
  eq(tostring(a):find('sae_alive', 1, true) ~= nil, true)
  raises(function() autopsy.run(model, {'some text'}, {saes = {s}, tokenizer = corpus}) end,
    "autopsy.run: saes are evaluated on the corpus's val split; give a corpus as the data")
end)

test('SAELens\'s format round trip in anatomy, and refusals of what it cannot read', function()
  local s = sae.train(model, corpus, with(quick, {k = 4}))
  local dir = H.tmpdir() .. '/sae'
  s:save(dir)
  local back = sae.load(dir)
  eq(back.cfg.point, POINT); eq(back.cfg.kind, 'topk'); eq(back.cfg.k, 4)
  -- cfg.json names the point as SAELens and TransformerLens do; anatomy's name is in the metadata, and either reads back
  local written = require('anatomy.io.json').decode(fs.read(dir .. '/cfg.json'))
  eq(written.metadata.hook_name, 'blocks.0.hook_resid_post')
  eq(written.metadata.anatomy_point, POINT)
  eq(back.cfg.hook_name, 'blocks.0.hook_resid_post')
  written.metadata.anatomy_point = nil
  fs.write_atomic(dir .. '/cfg.json', require('anatomy.io.json').encode(written))
  local tl_named = sae.load(dir)
  eq(tl_named.cfg.point, 'blocks.0.hook_resid_post')
  local hook = sae.attach(model, tl_named)
  eq(probe.list(model)[1].at, POINT, "an SAE named by TransformerLens's name attaches at anatomy's point")
  hook:remove()
  local bare = sae.new{d_in = 16, d_sae = 8, point = POINT}
  bare:save(dir .. '2', {model = model})
  eq(require('anatomy.io.json').decode(fs.read(dir .. '2/cfg.json')).metadata.hook_name, 'blocks.0.hook_resid_post')
  local x = torch.randn(9, 16)
  H.identical(back:encode(x), s:encode(x), 'features after a round trip')
  raises(function() sae.load(H.tmpdir()) end, "has no cfg.json (an SAELens folder holds cfg.json and sae_weights.safetensors)")
  local bad = H.tmpdir()
  fs.write_atomic(bad .. '/cfg.json', '{"architecture": "gated", "d_in": 4, "d_sae": 8}')
  raises_part(function() sae.load(bad) end, "architecture 'gated' is not one anatomy reads")
  fs.write_atomic(bad .. '/cfg.json', '{"architecture": "standard", "d_in": 5, "d_sae": 48}')
  torch.save_safetensors(bad .. '/sae_weights.safetensors', {W_enc = torch.zeros(16, 48), b_enc = torch.zeros(48),
    W_dec = torch.zeros(48, 16), b_dec = torch.zeros(16)})
  raises_part(function() sae.load(bad) end, 'W_enc has shape 16x48, cfg.json (d_in 5, d_sae 48) says 5x48')
  fs.write_atomic(bad .. '/cfg.json', 'not json')
  raises_part(function() sae.load(bad) end, 'cfg.json is not JSON')
end)

test('bad options and inputs are errors naming the function and the argument, checked before the model runs', function()
  raises(function() sae.train(model, corpus, {steps = 5}) end, "sae.train: point must name where to read ('blocks.3.resid_post'), got nil")
  raises(function() sae.train(model, corpus, {point = POINT, kind = 'gated'}) end,
    "sae.train: kind must be 'topk', 'relu', 'jumprelu' or 'batchtopk', got gated")
  raises(function() sae.train(model, corpus, {point = POINT, kind = 'relu', k = 4}) end, "sae.train: k is for kind 'topk' or 'batchtopk', not 'relu'")
  raises(function() sae.train(model, corpus, {point = POINT, width = 8, k = 9}) end, 'sae.train: k must be at most width 8, got 9')
  raises(function() sae.train(model, corpus, {point = POINT, lr = 0 / 0}) end, 'sae.train: lr must be a number in [0, 1], got nan')
  -- every option's error is at the caller's line, not inside the library
  for _, bad in ipairs{{k = 0 / 0}, {steps = 1.5}, {batch = 0}, {width = -3}, {seed = 'one'}, {dead_after = 0}, {lr = -1},
      {kind = 'gated'}, {cache = ''}, {quiet = 1}, {transcoder = 'yes'}, {resume = 3}, {checkpoint_every = 0}} do
    local opts = with({point = POINT}, bad)
    local ok, err = pcall(function() sae.train(model, corpus, opts) end)
    local key = next(bad)
    eq(ok, false, key)
    eq(tostring(err):match('^[^:]*test_sae%.lua:%d+: sae%.train: ') ~= nil, true, key .. ': ' .. tostring(err))
  end
  raises_part(function() sae.train(model, corpus, {point = POINT, stpes = 5}) end, "sae.train: unknown option 'stpes'")
  raises_part(function() sae.train(model, corpus, {point = 'blocks.9.resid_post'}) end, 'sae.train: point:')
  raises(function() sae.train(model, nil, {point = POINT}) end, 'sae.train: corpus must be a data.Corpus, got nil')
  raises(function() sae.train(model, corpus, {point = 'blocks.1.resid_post', transcoder = true}) end,
    "sae.train: a transcoder reads a module's input and output; 'blocks.1.resid_post' is a hook point")
  local s = sae.new{d_in = 16, d_sae = 32}
  raises(function() s:encode(torch.ones(3, 5)) end, "sae:encode: x must end in the SAE's d_in 16, got shape 3x5")
  raises(function() s:decode(torch.ones(3, 5)) end, "sae:decode: f must be a Tensor ending in the SAE's d_sae 32, got shape 3x5")
  raises(function() sae.new{d_in = 16, d_sae = 8, k = 9} end, 'sae.new: k must be at most d_sae 8, got 9')
  raises(function() sae.new{d_in = 16} end, "sae.new: d_in and d_sae are needed (the point's width and the number of features)")
  local wrong = sae.new{d_in = 8, d_sae = 16, point = POINT}
  local h = sae.attach(model, wrong)
  raises_part(function() model(windows(16, 1)) end, "sae.attach: the activation at 'blocks.1.resid_post' is 16 wide; the SAE's d_in is 8")
  h:remove()
  raises(function() sae.attach(model, {}) end, 'sae.attach: s must be an SAE (sae.train, sae.load, sae.new), got table')
  raises(function() sae.attach(model, s, {error_term = 1}) end, 'sae.attach: error_term must be true or false, got 1')
  raises(function() sae.attach(model, s) end, "sae.attach: the SAE names no point; give {point = 'blocks.3.resid_post'}")
  raises(function() sae.top_activations(model, wrong, corpus, {features = {17}}) end,
    'sae.top_activations: features[1] must be a whole number in 1..16 (the SAE has 16 features), got 17')
end)

H.done()
