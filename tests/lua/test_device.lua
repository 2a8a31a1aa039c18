-- Devices: every tensor that training, a probe, an intervention, a metric,
-- a lens or an SAE makes for a model is made on the model's device, never on
-- the default device. Each call runs twice: with the default device the
-- model's, and with the default device 'meta' (tensors with a shape but no
-- data), where a tensor made on the default device fails at once (it cannot
-- be read or mixed with the model's) or shows in its .device. Both runs must
-- give the same numbers. On the CPU this catches the class of bug a GPU shows
-- when the model is not on the default device (a model kept on the CPU under
-- --device=cuda, or moved with m:to after it was built).
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, raises, raises_part = H.test, H.eq, H.raises, H.raises_part

local home = torch.device()
torch.manual_seed(0)
local corpus = data.from_string(('the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs. '):rep(60))
local V = corpus.vocab_size
-- make() with the default device the model's: models are built where they run
local function built(make)
  local was = torch.device()
  torch.set_default_device(home)
  torch.manual_seed(1)
  local ok, m = pcall(make)
  torch.set_default_device(was)
  if not ok then error(m, 0) end
  return m
end
local function gpt()
  return built(function() return models.gpt{vocab = V, dim = 16, heads = 2, layers = 2, seq = 16, ffn = 32, norm = 'pre'} end)
end
local model = gpt()
train.fit(model, corpus, {steps = 20, batch = 8, seq = 16, quiet = true})
model:eval()
local device = model:device()
torch.manual_seed(3)
local x, x2 = torch.randint(1, V + 1, {2, 8}), torch.randint(1, V + 1, {2, 8})
local y = torch.randint(1, V + 1, {2, 8})

-- f() with the default device 'meta', restored after (also on an error)
local function on_meta(f)
  torch.set_default_device('meta')
  local ok, a, b = pcall(f)
  torch.set_default_device(home)
  probe.clear(model)
  if not ok then error(a, 0) end
  return a, b
end

-- Compares two results, walking tables (each table once) and tensors:
-- numbers and tensor values must agree within a relative 1e-6, strings and
-- booleans exactly; every tensor of the meta run must hold data (none made
-- on the default device). Keys that are clocks are left out.
local clock = {seconds = true, started = true, started_utc = true, finished_utc = true, elapsed = true, tokens_per_second = true,
  wall_seconds = true, step_seconds = true, rows_per_second = true, _model = true, _sae = true, _tokenizer = true}
local function same(a, b, path, seen)
  seen = seen or {}
  if torch.is_tensor(a) then
    if not torch.is_tensor(b) then error(('%s: a Tensor against %s'):format(path, type(b)), 0) end
    if b.device == 'meta' then error(('%s: made on the default device (meta), not the model\'s (%s)'):format(path, a.device), 0) end
    if a.device ~= b.device then error(('%s: on %s with the default device the model\'s, on %s otherwise'):format(path, a.device, b.device), 0) end
    eq(b:size(), a:size(), path .. ' shape')
    if a:numel() == 0 or a.dtype == 'bool' or a.dtype == 'int64' then
      if a:numel() > 0 and not a:eq(b):all():item() then error(path .. ': the values differ', 0) end
      return
    end
    local ad, bd = a:detach():double():cpu(), b:detach():double():cpu()
    local nan = ad:isnan()
    if not nan:eq(bd:isnan()):all():item() then error(path .. ': NaN in one run only', 0) end
    local diff = (ad - bd):masked_fill(nan, 0):abs():max():item()
    local scale = math.max(1, ad:masked_fill(nan, 0):abs():max():item())
    if diff > 1e-6 * scale then error(('%s: the values differ by up to %.3g'):format(path, diff), 0) end
  elseif type(a) == 'table' then
    if seen[a] then return end
    seen[a] = true
    if type(b) ~= 'table' then error(('%s: a table against %s'):format(path, type(b)), 0) end
    for k, v in pairs(a) do
      if not clock[k] and type(v) ~= 'function' then same(v, b[k], path .. '.' .. tostring(k), seen) end
    end
  elseif type(a) == 'number' then
    if type(b) ~= 'number' then error(('%s: %s against %s'):format(path, tostring(a), type(b)), 0) end
    if a ~= a then
      if b == b then error(('%s: NaN against %s'):format(path, b), 0) end
    elseif math.abs(a - b) > 1e-6 * math.max(1, math.abs(a)) then
      error(('%s: %.9g against %.9g'):format(path, a, b), 0)
    end
  elseif type(a) == 'string' or type(a) == 'boolean' then
    if a ~= b then error(('%s: %s against %s'):format(path, tostring(a), tostring(b)), 0) end
  end
end

-- name: f() run both ways, the results compared
local function both(name, f)
  test(name .. ': made on the model\'s device, the same numbers with the default device elsewhere', function()
    torch.manual_seed(5)
    local want = f()
    probe.clear(model)
    torch.manual_seed(5)
    local got = on_meta(f)
    same(want, got, name)
  end)
end

test('meta is a device: tensors with a shape and a dtype and no data, printed as such', function()
  local t = torch.ones(2, 3):to('meta')
  eq(t.device, 'meta')
  eq(t:size(), {2, 3})
  assert(tostring(t):find('tensor(..., size=(2, 3))', 1, true), tostring(t))
  raises(function() return t:sum():item() end, "calling 'item' on bad self (a meta tensor has a shape and a dtype but no values to read)")
  raises(function() return t:tolist() end, "calling 'tolist' on bad self (a meta tensor has a shape and a dtype but no values to read)")
  raises_part(function() torch.zeros(2, {device = 'tpu'}) end, "unknown device 'tpu', expected cpu, cuda, cuda:N, accel or meta")
  raises_part(function() gpt():to('meta') end, "models.GPT:to: parameters cannot move to 'meta' in place")
  local m = built(function() torch.set_default_device('meta'); return models.gpt{vocab = V, dim = 16, heads = 2, layers = 1, seq = 16, ffn = 32} end)
  eq(m:device(), 'meta')
  -- the check works: a tensor made on the default device is caught
  local ok, err = pcall(same, {v = torch.ones(2)}, on_meta(function() return {v = torch.ones(2)} end), 'made')
  assert(not ok and tostring(err):find("made.v: made on the default device (meta)", 1, true), tostring(err))
end)

both('train.fit', function()
  local m = gpt()
  local run = train.fit(m, corpus, {steps = 6, batch = 4, seq = 16, eval_every = 3, eval_batches = 2, quiet = true})
  return {history = run.history, weights = m:state_dict()}
end)

both('run_with_cache from ids and from texts', function()
  local out, c = probe.run_with_cache(model, x, {filter = {'*', '*.result'}})
  local out2, c2 = probe.run_with_cache(model, {'the fox', 'pack my box'}, {tokenizer = corpus})
  local t = {out = out, out2 = out2}
  for _, n in ipairs(c:names()) do t[n] = c[n] end
  for _, n in ipairs(c2:names()) do t['texts ' .. n] = c2[n] end
  return t
end)

both('ablate, set and patch', function()
  local t = {}
  local function run(name, h) t[name] = torch.no_grad(function() return model(x) end); h:remove() end
  run('zero', probe.ablate(model, 'blocks.1.attn.z', {head = 2}))
  run('mean', probe.ablate(model, 'blocks.1.attn.z', {head = 2, kind = 'mean', over = x2}))
  run('resample', probe.ablate(model, 'blocks.2.mlp.post', {kind = 'resample', over = x2, seed = 4}))
  run('set', probe.set(model, 'blocks.1.resid_post', 0.5, {position = 3}))
  local _, c = probe.run_with_cache(model, x2)
  run('patch', probe.patch(model, 'blocks.2.resid_pre', c))
  local v = steer.vector(model, {'the quick', 'the lazy'}, {'pack my', 'five doz'}, {tokenizer = corpus})
  run('steer', steer.apply(model, v, {coefficient = 2}))
  t.steer_vectors = v.vectors
  return t
end)

local function metric(logits) return logits[{{}, -1, 3}]:sum() - logits[{{}, -1, 5}]:sum() end
both('activation patching, AtP, AtP*, integrated gradients, edges and paths', function()
  local item = function(l) return metric(l):item() end
  return {
    layer = patching.run(model, x, x2, item, {over = 'resid_pre', per = 'layer'}).grid,
    head = patching.run(model, x, x2, item, {over = 'attn.z', per = 'head'}).grid,
    position = patching.run(model, x, x2, item, {over = 'resid_post', per = 'position'}).grid,
    atp = patching.attribute(model, x, x2, metric, {over = 'attn.z', per = 'head'}).grid,
    atp_star = patching.attribute(model, x, x2, metric, {over = 'attn.k', per = 'head', method = 'atp-qk'}).grid,
    ig = patching.attribute(model, x, x2, metric, {over = 'resid_pre', per = 'layer', method = 'ig'}).grid,
    edges = patching.edges(model, x, x2, metric).edges,
    edges_ig = patching.edges(model, x, x2, metric, {method = 'eap-ig'}).edges,
    path = patching.path(model, x, x2, item, {sender = {1, 1}, receivers = {2}}).value,
  }
end)

both('logit attribution, head detectors and weights', function()
  return {
    dla = probe.logit_attribution(model, x, 4).rows,
    heads = probe.detect_heads(model, x, {'previous_token', 'induction', 'duplicate_token'}),
    ov = weights.ov(model, 1, 1),
    composition = weights.composition(model, 'q'),
  }
end)

both('the logit and tuned lenses and linear probes', function()
  local tuned = lens.tuned(model, corpus, {steps = 3, seq = 16, quiet = true})
  return {
    logit = lens.logit(model):evaluate(x), trajectory = lens.logit(model):trajectory(x[1]),
    tuned = tuned:evaluate(x), translators = tuned.translators,
    linear = probe.linear(model, x, y, {steps = 20, control = true}).rows,
    linear_values = probe.linear(model, x, y:select(2, 1):double(), {steps = 20, position = -1}).rows,
  }
end)

both('generate, greedy and sampled, with a cache', function()
  local greedy, steps = model:generate(x, {max_new = 4, temperature = 0, return_cache = {'*.resid_post'}})
  return {greedy = greedy, steps = steps, sampled = model:generate(x, {max_new = 4, seed = 2, top_k = 3}),
    text = corpus:sample(model, 'the ', {max_new = 5, temperature = 0})}
end)

both('the autopsy, on a batch and on a corpus', function()
  return {batch = autopsy.run(model, {x, y}).rows, corpus = autopsy.run(model, corpus, {batch = 2, seq = 16, steps = 2}).rows}
end)

both('sae.train, evaluate, top_activations, attach, and a transcoder', function()
  local s = sae.train(model, corpus, {point = 'blocks.1.resid_post', steps = 8, batch = 64, width = 32, seq = 16, sequences = 4, quiet = true})
  local h = sae.attach(model, s, {error_term = true})
  local spliced = torch.no_grad(function() return model(x) end)
  h:remove()
  local tc = sae.train(model, corpus, {point = 'blocks.1.mlp', transcoder = true, steps = 4, batch = 64, width = 32, seq = 16, sequences = 4, quiet = true})
  return {weights = s:state_dict(), since = rawget(s, 'since_fired'), spliced = spliced, transcoder = tc:state_dict(),
    evaluation = sae.evaluate(model, s, corpus, {batches = 2, batch = 4, seq = 16}),
    top = sae.top_activations(model, s, corpus, {batches = 2, batch = 4, seq = 16, k = 3, features = {1, 2}})}
end)

both('the seed architectures: train, forward and autopsy', function()
  local out = {}
  for name, make in pairs{
    gate = function() return models.vibenet{vocab = V, dim = 16, layers = 2, seq = 16, block = 'gate'} end,
    hyper = function() return models.vibenet{vocab = V, dim = 16, layers = 2, seq = 16, block = 'hyper', streams = 2} end,
    funnel = function() return models.funnel{vocab = V, seq = 16, widths = {32, 16, 8}, attentions = {1, 2, 3}} end,
    stateful = function() return models.stateful{vocab = V, dim = 16, heads = 2, layers = 2, seq = 16, ffn = 32} end,
  } do
    local m = built(make)
    local run = train.fit(m, corpus, {steps = 3, batch = 4, seq = 16, quiet = true, recurrence = name == 'stateful' and 1 or nil})
    m:eval()
    out[name] = {history = run.history, logits = torch.no_grad(function() return m(x) end), rows = autopsy.run(m, {x, y}).rows}
  end
  return out
end)

H.done()
