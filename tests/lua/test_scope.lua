-- Every analysis leaves the model as it found it, after an error midway too
-- (probe.scope, the one mechanism): each module's training flag (a mix of
-- train and eval), every parameter's requires_grad and .grad, the grad mode,
-- and nothing left attached. Each function below is made to fail midway (a
-- metric, or a hook in the forward, raising on a later call) and the state is
-- compared before and after, and the next forward checked to be a fresh
-- one's (no key/value cache or padding mask left on).
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq = H.test, H.eq
local hooks = require('anatomy.probe.hooks')

local corpus = data.from_string(('the quick brown fox jumps over the lazy dog. '):rep(12))
torch.manual_seed(3)
local model = models.gpt{vocab = corpus.vocab_size, dim = 16, heads = 2, layers = 2, seq = 8, ffn = 32}:to(torch.get_default_device and torch.get_default_device() or 'cpu')
local device = model:device()
local clean = corpus:encode('the quick'):narrow(1, 1, 6):view(1, 6):to(device)
local corrupt = corpus:encode('the lazy '):narrow(1, 1, 6):view(1, 6):to(device)

-- the state an analysis must put back
local function snapshot(m)
  local s = {modes = {}, wants = {}, grads = {}, grad_mode = torch.is_grad_enabled(), attached = #probe.list(m)}
  for name, mod in m:named_modules() do s.modes[name] = rawget(mod, 'training') end
  for name, p in m:named_parameters() do
    s.wants[name] = p.requires_grad
    s.grads[name] = p.grad and p.grad:clone() or false
  end
  return s
end

local function same(a, b, what)
  eq(b.grad_mode, a.grad_mode, what .. ': grad mode')
  eq(b.attached, a.attached, what .. ': entries attached')
  for name, mode in pairs(a.modes) do eq(b.modes[name], mode, what .. ': training flag of ' .. (name ~= '' and name or 'the model')) end
  for name, want in pairs(a.wants) do eq(b.wants[name], want, what .. ': requires_grad of ' .. name) end
  for name, g in pairs(a.grads) do
    if g == false then eq(b.grads[name], false, what .. ': ' .. name .. '.grad stays nil')
    else eq(torch.equal(b.grads[name], g), true, what .. ': ' .. name .. '.grad as it was') end
  end
end

-- the logits of clean in eval mode, before any case ran
local reference_logits = torch.no_grad(function()
  model:eval()
  local y = model(clean)
  model:train()
  return y
end)

-- a mixed state: the model training, its second block in eval, one
-- parameter frozen, gradients present on the others
local function prepare()
  model:train()
  model.blocks[2]:eval()
  local frozen
  for name, p in model:named_parameters() do
    if not frozen then frozen = p; p:requires_grad_(false) else p:requires_grad_(true) end
    p.grad = p.requires_grad and torch.full_like(p, 0.25) or nil
  end
  return snapshot(model)
end

-- a metric that raises on its n-th call
local function failing_metric(n)
  local calls = 0
  local inner = patching.logit_diff(2, 3)
  return function(logits, mask)
    calls = calls + 1
    if calls >= n then error('boom from the metric') end
    return inner(logits, mask)
  end
end

-- runs fn with a hook in block 1 that raises on its n-th call (attached
-- in probe.with: the analysis accepts it, and it is removed after)
local function failing_forward(n, fn)
  local calls = 0
  local h = probe.replace(model, 'blocks.1', function(out)
    calls = calls + 1
    if calls >= n then error('boom from the forward') end
  end)
  return pcall(probe.with, h, fn)
end

-- an SAE on block 1's output, trained once on a clean model (for the cases that read one)
local an_sae
local function trained_sae()
  if not an_sae then
    an_sae = probe.scope(model, function()
      return sae.train(model, corpus, {point = 'blocks.1', width = 16, steps = 3, batch = 4, seq = 8, sequences = 2, buffer = 8,
        quiet = true})
    end)
  end
  return an_sae
end

local cases = {
  {'patching.run', function() return pcall(patching.run, model, clean, corrupt, failing_metric(4), {over = 'resid_pre'}) end},
  {'patching.path', function()
    return pcall(patching.path, model, clean, corrupt, failing_metric(3), {sender = {1, 1}, receivers = {{2, 1}}, via = 'k'})
  end},
  {'patching.attribute (atp)', function() return pcall(patching.attribute, model, clean, corrupt, failing_metric(2)) end},
  {'patching.attribute (ig)', function()
    return pcall(patching.attribute, model, clean, corrupt, failing_metric(4), {method = 'ig', steps = 3})
  end},
  {'patching.edges', function() return pcall(patching.edges, model, clean, corrupt, failing_metric(2)) end},
  {'autopsy.run', function() return failing_forward(1, function() return autopsy.run(model, corpus, {steps = 2, batch = 2, seq = 8}) end) end},
  {'train.evaluate', function() return failing_forward(2, function() return train.evaluate(model, corpus, {batch = 2, batches = 2}) end) end},
  {'train.evaluate (texts)', function()
    return failing_forward(1, function() return train.evaluate(model, corpus, {texts = {'the quick', 'the lazy'}}) end)
  end},
  {'lens.tuned', function()
    return failing_forward(3, function() return lens.tuned(model, corpus, {steps = 4, batch = 2, seq = 8, quiet = true}) end)
  end},
  {'lens.logit', function()
    return failing_forward(1, function() return lens.logit(model):evaluate(clean) end)
  end},
  {'steer.vector', function()
    return failing_forward(2, function() return steer.vector(model, {'the quic', 'the qui'}, {'the lazy', 'the laz'}, {tokenizer = corpus}) end)
  end},
  {'sae.train', function()
    return failing_forward(1, function()
      return sae.train(model, corpus, {point = 'blocks.1', width = 16, steps = 3, batch = 4, seq = 8, sequences = 2, buffer = 8,
        quiet = true})
    end)
  end},
  {'sae.evaluate', function()
    return failing_forward(2, function() return sae.evaluate(model, trained_sae(), corpus, {batches = 2, batch = 2, seq = 8}) end)
  end},
  {'sae.top_activations', function()
    return failing_forward(2, function() return sae.top_activations(model, trained_sae(), corpus, {batches = 2, batch = 2, seq = 8}) end)
  end},
  {'model:generate (cached)', function()
    return failing_forward(3, function() return model:generate(clean, {max_new = 4, kv_cache = true}) end)
  end},
  {'model:generate (padded)', function()
    local mask = torch.ones(2, 6, {dtype = 'bool', device = device})
    mask[2][1] = false
    return failing_forward(2, function() return model:generate(torch.cat({clean, corrupt}, 1), {max_new = 3, attention_mask = mask}) end)
  end},
}

for _, case in ipairs(cases) do
  test(case[1] .. ' fails midway and leaves the model as it was', function()
    local before = prepare()
    local ok, err = case[2]()
    eq(ok, false, case[1] .. ' raised')
    eq(tostring(err):find('boom from the', 1, true) ~= nil, true, 'the error is the one raised midway: ' .. tostring(err))
    same(before, snapshot(model), case[1])
    -- nothing else left on: a forward gives what a fresh one does (a cache
    -- or padding mask left behind would change it)
    eq(torch.equal(probe.scope(model, function() return torch.no_grad(function() return model(clean) end) end, {mode = 'eval'}),
      reference_logits), true, case[1] .. ': the next forward is unchanged (no cache, no padding left on)')
  end)
end

test('probe.scope puts back modes, hooks, grad mode, requires_grad and grads, and checks its arguments', function()
  local before = prepare()
  local ok = pcall(probe.scope, model, function(m)
    m.blocks[1]:eval()
    torch.set_grad_enabled(false)
    hooks.skip(m, 'blocks.2')
    for _, p in ipairs(m:parameters()) do p:requires_grad_(false); p.grad = nil end
    error('midway')
  end, {grads = true})
  eq(ok, false)
  same(before, snapshot(model), 'probe.scope')
  eq(select(2, probe.scope(model, function(m) return 1, 2 end)), 2, 'fn\'s results come back')
  local seen
  probe.scope(model, function(m) seen = m.training; for _, p in ipairs(m:parameters()) do eq(p.requires_grad, false) end end,
    {mode = 'eval', frozen = true})
  eq(seen, false, "mode = 'eval' runs fn in eval mode")
  same(before, snapshot(model), 'probe.scope with mode and frozen')
  H.raises_part(function() probe.scope(model, function() end, {mode = 'test'}) end, "probe.scope: mode must be 'eval' or 'train'")
  H.raises_part(function() probe.scope(model, function() end, {grad = true}) end, "probe.scope: unknown option 'grad', did you mean 'grads'?")
  H.raises_part(function() probe.scope({}, function() end) end, 'probe.scope: model must be a model')
  H.raises_part(function() probe.scope(model, 3) end, 'probe.scope: fn must be a function')
  H.raises_part(function() probe.scope(model, function() end, {padding = 3}) end, 'probe.scope: padding must be a (B, T) mask tensor or true')
  H.raises_part(function() probe.scope(model, function() end, {kv_cache = 'yes'}) end, 'probe.scope: kv_cache must be a boolean')
end)

-- The padding mask came off only when the key/value cache had: a cache that
-- failed to switch off left the mask on, and the next forward of another
-- batch size failed on it.
test('a key/value cache that fails to switch off still leaves no padding mask behind', function()
  local mask = torch.ones(2, 6, {dtype = 'bool'}):to(device)
  local kv_cache = model.kv_cache
  rawset(model, 'kv_cache', function(self, on)
    if not on then kv_cache(self, false); error('kv_cache: could not switch off', 0) end
    return kv_cache(self, on)
  end)
  local ok, err = pcall(probe.scope, model, function() return 1 end, {padding = mask, kv_cache = true})
  rawset(model, 'kv_cache', nil)
  eq(ok, false)
  eq(tostring(err), 'kv_cache: could not switch off', 'the failure is raised')
  local fine, out = pcall(model, clean)
  eq(fine, true, 'a batch of one runs: no mask of two examples left on (' .. tostring(out) .. ')')
end)

H.done()
