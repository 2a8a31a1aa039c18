-- Count options (batch, batches, steps, seq, every, k, ...) are checked where
-- they are given: 0, -1, 1.5, nan and inf are each an error naming the
-- function, the option and the value, and none of them may hang. Found by the
-- random-call fuzzer (tests/fuzz/lua_api.lua): train.evaluate{batch = 0} stepped
-- its loop by 0 and never ended.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local native = require('anatomy.torch.native')
local test = H.test

local bad = {0, -1, 1.5, 0 / 0, math.huge}
local bound = 20  -- seconds any one call may take; a loop that never ends is stopped here

-- fn() under the time bound: the count hook runs in Lua code (where the loops
-- that hung are); returns pcall's results
local function bounded(fn)
  local t0 = native.now()
  debug.sethook(function()
    if native.now() - t0 > bound then
      debug.sethook()
      error(('still running after %d s (a loop that does not end?)'):format(bound), 2)
    end
  end, '', 10000)
  local ok, err = pcall(fn)
  debug.sethook()
  return ok, err
end

-- call(v) for each bad value must raise "<where>: <name> must be ..., got <v>"
-- (train.fit's own checks say "option <name>"); low: the smallest allowed
-- value (0 where 0 means none), which is then left out of the bad ones.
local function refuses(where, name, call, low)
  for _, v in ipairs(bad) do
    if not (low == 0 and v == 0) then
      local ok, err = bounded(function() return call(v) end)
      if ok then error(('%s with %s = %s: no error'):format(where, name, tostring(v)), 2) end
      err = tostring(err)
      local said = err:find(where .. ': ', 1, true) and err:find(name .. ' must be', 1, true)
        and err:sub(-#('got ' .. tostring(v))) == 'got ' .. tostring(v)
      if not said then
        error(('%s with %s = %s: the error does not name the function, the option and the value:\n  %s'):format(
          where, name, tostring(v), err), 2)
      end
    end
  end
end

local corpus = data.from_string(('First Citizen: we are accounted poor citizens, the patricians good. '):rep(8))
torch.manual_seed(1)
local model = models.gpt{vocab = corpus.vocab_size, dim = 16, heads = 2, layers = 1, seq = 8, ffn = 32}

test('train.evaluate: batch, batches and seq, over the corpus, a text and a list of texts', function()
  for _, key in ipairs{'batch', 'batches', 'seq'} do
    -- a text within one window (batch = 0 was the step of a loop that never
    -- ended), one longer than the context, and the corpus's val split
    refuses('train.evaluate', key, function(v) return train.evaluate(model, corpus, {text = 'we are', [key] = v}) end)
    refuses('train.evaluate', key, function(v) return train.evaluate(model, corpus, {text = ('we are poor '):rep(5), [key] = v}) end)
    refuses('train.evaluate', key, function(v) return train.evaluate(model, corpus, {[key] = v}) end)
  end
  for _, key in ipairs{'batch', 'seq'} do
    refuses('train.evaluate', key, function(v) return train.evaluate(model, corpus, {texts = {'we are'}, [key] = v}) end)
  end
  H.eq(train.evaluate(model, corpus, {text = 'we are', batch = 1}).tokens, 5, 'a valid batch still judges the text')
end)

test('train.fit: the counts and probe.every', function()
  for _, key in ipairs{'steps', 'batch', 'seq', 'eval_every', 'log_every', 'eval_batches', 'checkpoint_every'} do
    refuses('train.fit', key, function(v) return train.fit(model, corpus, {steps = 1, quiet = true, [key] = v}) end)
  end
  refuses('train.fit', 'probe.every', function(v) return train.fit(model, corpus, {steps = 1, quiet = true, probe = {every = v}}) end)
  H.raises(function() train.fit(model, corpus, {steps = 1, quiet = true, probe = {evry = 5}}) end,
    "train.fit: probe: unknown option 'evry', did you mean 'every'? (expected every, filter, fn, grad)")
end)

test('autopsy.run: steps, batch, seq and k', function()
  for _, key in ipairs{'steps', 'batch', 'seq'} do
    refuses('autopsy.run', key, function(v) return autopsy.run(model, corpus, {[key] = v}) end)
  end
  refuses('autopsy.run', 'k', function(v) return autopsy.run(model, corpus, {k = v}) end, 0)
end)

test('lens.tuned, sae.train, sae.evaluate and sae.top_activations', function()
  for _, key in ipairs{'steps', 'batch', 'seq', 'log_every'} do
    refuses('lens.tuned', key, function(v) return lens.tuned(model, corpus, {quiet = true, [key] = v}) end)
    refuses('sae.train', key, function(v) return sae.train(model, corpus, {point = 'blocks.1.resid_post', quiet = true, [key] = v}) end)
  end
  local s = sae.new{d_in = 16, d_sae = 32, kind = 'relu', point = 'blocks.1.resid_post'}
  for _, key in ipairs{'batches', 'batch', 'seq'} do
    refuses('sae.evaluate', key, function(v) return sae.evaluate(model, s, corpus, {[key] = v}) end)
    refuses('sae.top_activations', key, function(v) return sae.top_activations(model, s, corpus, {[key] = v}) end)
  end
  refuses('sae.top_activations', 'k', function(v) return sae.top_activations(model, s, corpus, {k = v}) end)
end)

test('patching.attribute and patching.edges: steps', function()
  local clean, corrupt = torch.tensor({{1, 2, 3}}, {dtype = 'int64'}), torch.tensor({{1, 4, 3}}, {dtype = 'int64'})
  local function metric(logits) return logits[{1, -1, 2}] - logits[{1, -1, 3}] end
  refuses('patching.attribute', 'steps', function(v) return patching.attribute(model, clean, corrupt, metric, {method = 'ig', steps = v}) end)
  refuses('patching.edges', 'steps', function(v) return patching.edges(model, clean, corrupt, metric, {method = 'eap-ig', steps = v}) end)
end)

test('generate, probe.test_prompt and cache:attention', function()
  local ids = torch.tensor({{1, 2}}, {dtype = 'int64'})
  refuses('generate', 'max_new', function(v) return model:generate(ids, {max_new = v}) end, 0)
  refuses('generate', 'top_k', function(v) return model:generate(ids, {max_new = 1, top_k = v}) end)
  refuses('probe.test_prompt', 'top_k', function(v)
    return probe.test_prompt(model, 'we are', ' p', {tokenizer = corpus, quiet = true, top_k = v})
  end, 0)
  local _, cache = probe.run_with_cache(model, ids)
  refuses('cache:attention', 'batch', function(v) return cache:attention(1, 1, {batch = v}) end)
end)

test('optim.lr_scheduler: steps and warmup; nn.HyperConnections: streams and iters', function()
  local opt = optim.AdamW(model:parameters(), {lr = 1e-3})
  refuses('optim.lr_scheduler', 'steps', function(v) return optim.lr_scheduler(opt, {steps = v}) end)
  refuses('optim.lr_scheduler', 'warmup', function(v) return optim.lr_scheduler(opt, {steps = 10, warmup = v}) end, 0)
  H.raises(function() optim.lr_scheduler(opt, {}) end, 'optim.lr_scheduler: steps is required (the length of the run, a whole number >= 1)')
  refuses('nn.HyperConnections', 'streams', function(v) return nn.HyperConnections(nn.Linear(4, 4), 4, {streams = v}) end)
  refuses('nn.HyperConnections', 'iters', function(v) return nn.HyperConnections(nn.Linear(4, 4), 4, {iters = v}) end, 0)
end)

test('the error is at the line that gave the option', function()
  local line = debug.getinfo(1, 'l').currentline + 1
  local ok, err = pcall(function() train.evaluate(model, corpus, {batch = 0}) end)
  H.eq(ok, false)
  H.eq(tostring(err):match('test_counts%.lua:(%d+): train%.evaluate: batch must be a whole number >= 1, got 0$'), tostring(line), tostring(err))
  line = debug.getinfo(1, 'l').currentline + 1
  ok, err = pcall(function() train.fit(model, corpus, {steps = 1, quiet = true, probe = {every = 0}}) end)
  H.eq(tostring(err):match('test_counts%.lua:(%d+): train%.fit: probe%.every must be a whole number >= 1, got 0$'), tostring(line), tostring(err))
end)

H.done()
