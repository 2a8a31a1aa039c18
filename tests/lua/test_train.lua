-- Data, training, checkpoints and sampling, on small texts made here.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local native = require('anatomy.torch.native')
local test, eq, close, raises = H.test, H.eq, H.close, H.raises

local sample_text = ('First Citizen: we are accounted poor citizens, the patricians good. '):rep(40)

local tmpfile = H.tmpfile

local json = require('anatomy.io.json')

test('char and byte tokenizers round-trip, ids are 1-based', function()
  local path = tmpfile('héllo wörld\nline two ✓')
  local c = data.text(path)
  eq(c.tokenizer, 'char')
  local ids = c:tokens()
  eq(c:decode(ids), 'héllo wörld\nline two ✓')
  eq(ids:min():item(), 1)
  eq(ids:max():item(), c.vocab_size)
  eq(c:decode(c:encode('wörld')), 'wörld')
  raises(function() c:encode('z') end, "bad argument #1 to 'encode' (character 'z' (U+007A) is not in the vocabulary)")
  raises(function() c:decode({0}) end, "bad argument #1 to 'decode' (token id 0 is out of range 1.." .. c.vocab_size .. ')')
  local b = data.text(path, {tokenizer = 'byte'})
  eq(b.vocab_size, 256)
  eq(b:decode(b:tokens()), 'héllo wörld\nline two ✓')
  eq(b:encode('A'):item(), 66, "byte 65 ('A') is id 66")
  os.remove(path)
  raises(function() data.text('/no/such/file.txt') end, "cannot open '/no/such/file.txt': No such file or directory")
  raises(function() data.text(path, {tokenizer = 'words'}) end, "bad argument #2 to 'data.text' (unknown tokenizer 'words', expected char, byte or sentencepiece)")
end)

test('sentencepiece trains on the text, caches its model and round-trips', function()
  local dir = H.tmpdir()
  local path = dir .. '/corpus.txt'
  local f = assert(io.open(path, 'wb'))
  f:write(sample_text:rep(5), 'Second Citizen: would you proceed especially against Caius Marcius?\n')
  f:close()
  local ok, c = pcall(data.text, path, {tokenizer = 'sentencepiece', vocab_size = 60})
  if not ok and tostring(c):find('sanitizer build', 1, true) then
    print('       (skipped: ' .. tostring(c):match('%((.*)') .. ')')
    return
  end
  assert(ok, c)
  eq(c.tokenizer, 'sentencepiece')
  assert(c.vocab_size <= 60 and c.vocab_size > 20, 'vocabulary of about the size asked: ' .. c.vocab_size)
  local model = dir .. '/corpus.txt.sp60.bpe.model'
  assert(io.open(model, 'rb'), 'the model is cached beside the text')
  local phrase = 'we are accounted poor citizens'
  eq(c:decode(c:encode(phrase)), phrase)
  assert(c:encode(phrase):numel() < #phrase, 'subwords are longer than characters')
  local again = data.text(path, {tokenizer = 'sentencepiece', model = model})
  eq(again:encode(phrase):tolist(), c:encode(phrase):tolist())
  local u = data.text(path, {tokenizer = 'sentencepiece', vocab_size = 60, type = 'unigram'})
  eq(u:decode(u:encode(phrase)), phrase)
  raises(function() data.text(path, {tokenizer = 'sentencepiece', model = dir .. '/missing.model'}) end,
    ("cannot load SentencePiece model '%s/missing.model': Not found: \"%s/missing.model\": No such file or directory Error #2"):format(dir, dir))
  os.execute("rm -rf '" .. dir .. "'")
end)

test('batches are windows of the split, targets shifted by one', function()
  local c = data.from_string(sample_text, {split = 0.9})
  eq(c:size('train') + c:size('val'), c:size())
  eq(c:size('train'), math.floor(c:size() * 0.9))
  torch.manual_seed(0)
  local x, y = c:batch(4, 16)
  eq(x:size(), {4, 16})
  eq(y:size(), {4, 16})
  eq(x.dtype, 'int64')
  close(x[{{}, {2, 16}}], y[{{}, {1, 15}}], 0, 'targets are the inputs shifted by one')
  -- each row is a real window of the training text
  local train_text = c:decode(c:tokens('train'))
  for b = 1, 4 do
    assert(train_text:find(c:decode(x[b]) .. c:decode(y[b][16]), 1, true), 'row ' .. b .. ' is a window of the text')
  end
  local vx = c:batch(2, 8, {split = 'val'})
  assert(c:decode(c:tokens('val')):find(c:decode(vx[1]), 1, true), 'val batches come from the val split')
  raises(function() c:batch(2, 10000) end, ("bad argument #2 to 'batch' (the train split has %d tokens, too few for windows of 10000 plus a target)"):format(c:size('train')))
end)

test('a tiny model overfits a short text', function()
  torch.manual_seed(1)
  local c = data.from_string(('abcdefgh'):rep(50), {split = 0.9})
  local m = models.gpt{vocab = c.vocab_size, dim = 32, heads = 2, layers = 1, seq = 16, ffn = 64}
  local run = train.fit(m, c, {steps = 150, batch = 16, lr = 1e-2, warmup = 10, quiet = true})
  assert(run.train[150] < 0.05, ('final loss %.4f should be near zero'):format(run.train[150]))
  assert(run.val[#run.val].loss < 0.05, 'and so should the val loss')
  eq(c:sample(m, 'abc', {max_new = 10, temperature = 0}), 'abcdefghabcde')
end)

-- The run the resume tests compare with: its corpus, a fresh checkpoint path, a
-- model maker (the same weights each time), its options and its 20 losses.
local function resumable_run()
  local c = data.from_string(sample_text)
  local path = os.tmpname()
  os.remove(path)
  local function model() torch.manual_seed(7); return models.vibenet{vocab = c.vocab_size, dim = 16, layers = 2, seq = 16, block = 'gate'} end
  local opts = {steps = 20, batch = 4, lr = 3e-3, warmup = 3, eval_every = 5, seed = 11, quiet = true}
  return c, path, model, opts, train.fit(model(), c, opts)
end

test('a resumed run gives bit-identical losses', function()
  local c, path, model, opts, whole = resumable_run()
  -- the same run, stopped after 10 steps, then resumed from its checkpoint
  local first = {}
  for k, v in pairs(opts) do first[k] = v end
  first.checkpoint, first.checkpoint_every = path, 10
  first.on_step = function(step) if step == 10 then error('stop here') end end
  pcall(train.fit, model(), c, first)
  first.on_step = nil
  local resumed = train.fit(model(), c, first)
  eq(resumed.resumed_from, 10)
  eq(#resumed.train, 10)
  for i = 1, 10 do
    if resumed.train[i] ~= whole.train[10 + i] then
      error(('step %d: resumed %.17g, uninterrupted %.17g'):format(10 + i, resumed.train[i], whole.train[10 + i]))
    end
  end
  os.remove(path)
end)

test('a resumed run with dropout gives bit-identical losses: the device draws from its own generator, saved too', function()
  local c = data.from_string(sample_text)
  local path = os.tmpname()
  os.remove(path)
  local function model()
    torch.manual_seed(7)
    return nn.Sequential{nn.Embedding(c.vocab_size, 16), nn.Dropout(0.5), nn.Linear(16, c.vocab_size)}
  end
  local opts = {steps = 12, batch = 4, seq = 16, lr = 3e-3, seed = 11, quiet = true}
  local whole = train.fit(model(), c, opts)
  local first = {checkpoint = path, checkpoint_every = 6, on_step = function(step) if step == 6 then error('stop here') end end}
  for k, v in pairs(opts) do first[k] = v end
  pcall(train.fit, model(), c, first)
  first.on_step = nil
  local resumed = train.fit(model(), c, first)
  eq(resumed.resumed_from, 6)
  for i = 1, 6 do
    if resumed.train[i] ~= whole.train[6 + i] then
      error(('step %d: resumed %.17g, uninterrupted %.17g'):format(6 + i, resumed.train[i], whole.train[6 + i]))
    end
  end
  os.remove(path)
end)

test('a run stopped by Ctrl-C or by its time budget leaves a checkpoint at its last whole step, and resumes exactly', function()
  local c, path, model, opts, whole = resumable_run()
  local function continued(from, stop)
    local o = {}
    for k, v in pairs(opts) do o[k] = v end
    o.checkpoint = path
    for k, v in pairs(stop) do o[k] = v end
    local first = train.fit(model(), c, o)
    eq(first.steps, from, 'the step the run stopped after')
    assert(io.open(path, 'rb'), 'a checkpoint is written when the run stops early')
    o.on_step, o.seconds = nil, nil
    o.resume = true
    local resumed = train.fit(model(), c, o)
    eq(resumed.resumed_from, from)
    for i = 1, 20 - from do
      if resumed.train[i] ~= whole.train[from + i] then
        error(('step %d: resumed %.17g, uninterrupted %.17g'):format(from + i, resumed.train[i], whole.train[from + i]))
      end
    end
    os.remove(path)
    return first
  end
  -- Ctrl-C inside step 7 (its report): the step finishes, the run stops after it. (system() ignores
  -- SIGINT while its child runs: the signal comes from a background shell while this waits in Lua.)
  local stopped = continued(7, {on_step = function(step)
    if step ~= 7 then return end
    os.execute('(sleep 0.1; kill -INT $PPID) &')
    local t = native.now()
    while native.now() - t < 1 do end
  end})
  eq(stopped.interrupted, true)
  -- a budget of no time: one step, then the checkpoint
  continued(1, {seconds = 1e-9})
end)

test('a NaN from a Lua block is reported with the block\'s name', function()
  local Bad = nn.block('Bad', function(self) self.fc = nn.Linear(16, 16) end)
  function Bad:forward(x) return self.fc(x):log() end     -- log of negatives: NaN
  local m = models.vibenet{vocab = 30, dim = 16, layers = 3, seq = 16}
  m.blocks[2].inner = Bad()
  local c = data.from_string(sample_text)
  local msg = 'train.fit: the loss is nan at step 1; first non-finite value in the output of blocks.2.inner (Bad)'
  raises(function() train.fit(m, c, {steps = 5, batch = 2, quiet = true, sync = true}) end, msg)
  if m:device() == 'cpu' then raises(function() train.fit(m, c, {steps = 5, batch = 2, quiet = true}) end, msg) end
  -- read one step late (a GPU's bookkeeping, here forced): the parameters hold
  -- the bad step's update, so no module is named on their word (they blamed
  -- the embedding, the first to read them)
  m.blocks[2].inner = Bad()
  raises(function() train.fit(m, c, {steps = 5, batch = 2, quiet = true, _gpu_paths = true}) end,
    'train.fit: the loss is nan at step 1; it was read after the optimizer had taken that step (on ' .. m:device()
    .. ' the loss is read one step late, so that the device never waits), so the module whose output first went '
    .. 'non-finite cannot be named from the parameters now: rerun with sync = true to find it')
end)

test('a failed checkpoint write keeps the previous checkpoint loadable', function()
  local c = data.from_string(sample_text)
  torch.manual_seed(3)
  local m = models.gpt{vocab = c.vocab_size, dim = 16, heads = 2, layers = 1, seq = 16, ffn = 32}
  local path = os.tmpname()
  os.remove(path)
  train.fit(m, c, {steps = 4, batch = 2, checkpoint = path, quiet = true})
  local head_at_4 = m.head.weight:clone()
  local before = io.open(path, 'rb'):read('*a')
  -- a file-size limit (SIGXFSZ ignored) makes the next write fail midway
  local ffi = require('ffi')
  pcall(ffi.cdef, [[
    struct anatomy_rlimit { unsigned long cur, max; };
    int getrlimit(int, struct anatomy_rlimit*); int setrlimit(int, const struct anatomy_rlimit*);
    void* signal(int, void*);]])
  local RLIMIT_FSIZE, SIGXFSZ = 1, 25
  local limit = ffi.new('struct anatomy_rlimit')
  ffi.C.getrlimit(RLIMIT_FSIZE, limit)
  local saved_cur = limit.cur
  local old = ffi.C.signal(SIGXFSZ, ffi.cast('void*', 1))  -- SIG_IGN
  limit.cur = 2048
  ffi.C.setrlimit(RLIMIT_FSIZE, limit)
  local ok, err = pcall(train.fit, m, c, {steps = 8, batch = 2, checkpoint = path, quiet = true})
  limit.cur = saved_cur
  ffi.C.setrlimit(RLIMIT_FSIZE, limit)
  ffi.C.signal(SIGXFSZ, old)
  eq(ok, false, 'the write fails')
  eq(tostring(err):find(("cannot write '%s': File too large"):format(path), 1, true) ~= nil, true, tostring(err))
  eq(io.open(path, 'rb'):read('*a') == before, true, 'the previous checkpoint is untouched')
  local m2 = models.gpt{vocab = c.vocab_size, dim = 16, heads = 2, layers = 1, seq = 16, ffn = 32}
  local step, meta = train.load_checkpoint(path, m2)
  eq(step, 4)
  eq(meta['config.steps'], '4')
  eq(meta['model.dim'], '16')
  close(m2.head.weight, head_at_4, 0, 'the checkpoint holds the weights of step 4')
  os.remove(path)
end)

test('evaluate judges any text; compression measures it', function()
  local c = data.from_string(sample_text)
  torch.manual_seed(4)
  local m = models.gpt{vocab = c.vocab_size, dim = 16, heads = 2, layers = 1, seq = 16, ffn = 32}
  local r = train.evaluate(m, c, {text = 'we are accounted poor citizens'})
  close(r.bits, r.nats / math.log(2), 1e-12)
  assert(r.nats > 0 and r.tokens > 0)
  local uniform = math.log(c.vocab_size)
  assert(math.abs(r.nats - uniform) < 1.5, 'an untrained model is near uniform')
  local repetitive = ('abc'):rep(200)
  assert(text.compression_ratio(repetitive) < 0.1, 'repetition compresses')
  eq(text.compressed_size(''), 8)
end)

test('stateful recurrence trains with a loss per depth, and generates as an RNN', function()
  local c = data.from_string(sample_text)
  torch.manual_seed(5)
  local m = models.stateful{vocab = c.vocab_size, dim = 16, heads = 2, layers = 1, seq = 16, ffn = 32}
  local run = train.fit(m, c, {steps = 30, batch = 8, lr = 1e-2, recurrence = 2, quiet = true})
  eq(#run.depth_losses, 30)
  eq(#run.depth_losses[1], 3, 'one ordinary pass and two recurrent ones')
  eq(run.train[30], run.depth_losses[30][3], "the step's loss is the deepest pass's")
  assert(run.depth_losses[30][1] < run.depth_losses[1][1], 'it learns')
  local out = m:generate(c:encode('First'), {max_new = 12, temperature = 0})
  eq(out:numel(), 5 + 12)
  raises(function() train.fit(models.gpt{vocab = c.vocab_size, dim = 16, heads = 2, layers = 1, seq = 16, ffn = 32}, c,
    {steps = 1, recurrence = 1, quiet = true}) end, 'train.fit: recurrence needs a stateful model (models.stateful), got models.GPT')
end)

test('options are checked', function()
  local c = data.from_string(sample_text)
  local m = models.gpt{vocab = c.vocab_size, dim = 16, heads = 2, layers = 1, seq = 16, ffn = 32}
  raises(function() train.fit(m, c, {stepz = 3}) end, "train.fit: unknown option 'stepz', did you mean 'steps'? (expected batch, betas, "
    .. 'bucket_mb, checkpoint, checkpoint_every, clip, cuda_graph, decay, dtype, eval_batches, eval_every, keep_checkpoints, log, log_every, lr, on_step, probe, quiet, '
    .. 'recurrence, resume, schedule, seconds, seed, seq, steps, sync, warmup, weight_decay)')
  local empty = os.tmpname()
  raises(function() train.fit(m, c, {steps = 2, checkpoint = empty, quiet = true}) end,
    ("'%s' is not a valid safetensors file: it is 0 bytes long, shorter than the 8-byte header length"):format(empty))
  os.remove(empty)
end)

test('optim.clip_grad_norm: the total norm over all gradients, scaled down to max_norm', function()
  local a = torch.zeros(2, {requires_grad = true})
  local b = torch.zeros(1, {requires_grad = true})
  local loss = (a * torch.tensor({3, 4})):sum() + (b * 12):sum()
  loss:backward()
  eq(optim.clip_grad_norm({a, b}, 0), 13, 'no clipping: sqrt(9 + 16 + 144)')
  close(a.grad, {3, 4}, 0, 'unchanged without max_norm')
  local total = optim.clip_grad_norm({a, b}, 6.5)
  eq(total, 13, 'the norm before clipping')
  close(a.grad, {1.5, 2}, 1e-6, 'halved')
  close(b.grad, {6}, 1e-6, 'halved')
  eq(optim.clip_grad_norm({torch.zeros(2)}, 1), 0, 'no gradients: 0')
end)

test('resuming for more steps keeps the schedule it was trained on, and the log\'s time goes on', function()
  local c = data.from_string(sample_text)
  local path, log = os.tmpname(), os.tmpname()
  os.remove(path)
  os.remove(log)
  local function model() torch.manual_seed(7); return models.gpt{vocab = c.vocab_size, dim = 16, heads = 2, layers = 1, seq = 16, ffn = 32} end
  local lrs = {}
  local opts = {steps = 10, batch = 4, lr = 1e-2, warmup = 2, eval_every = 10, seed = 3, quiet = true, checkpoint = path, log = log,
    on_step = function(step, info) lrs[step] = info.lr end}
  train.fit(model(), c, opts)
  local lr10 = lrs[10]
  close(lr10, 1e-3, 1e-9, 'the cosine schedule ends at lr/10')
  opts.steps = 20
  local run = train.fit(model(), c, opts)
  eq(run.resumed_from, 10)
  eq(lrs[11], lr10, 'step 11 goes on at the end of the schedule instead of jumping back up')
  eq(lrs[20], lr10)
  -- the log: time never goes back
  local last = -1
  for line in io.lines(log) do
    local t = tonumber(line:match('"time": ([%d.]+)'))
    assert(t and t >= last, 'time goes back in ' .. line)
    last = t
  end
  assert(run.total_seconds >= run.seconds, 'total time counts the resumed run')
  -- a training checkpoint is not a weights file
  raises(function() model():load(path) end, "is a training checkpoint (model, optimizer and step), not a weights file: use "
    .. "train.load_checkpoint(path, model[, optimizer]), or train.fit(..., {checkpoint = path, resume = true})")
  os.remove(path)
  os.remove(log)
end)

test('a model without config.seq trains at the length of its position table', function()
  local c = data.from_string(sample_text)
  local m = nn.Sequential{nn.Embedding(c.vocab_size, 8, {positions = 12}), nn.Linear(8, c.vocab_size)}
  local run = train.fit(m, c, {steps = 2, batch = 2, quiet = true, eval_every = 2})
  eq(run.config['config.seq'], 12)
  eq(train.evaluate(m, c, {batches = 1, batch = 2}).tokens, 2 * 12, 'evaluation windows of 12 tokens')
end)

test('SGD, Adam and a learning-rate scheduler outside train.fit', function()
  local w = torch.tensor({1, -2}, {requires_grad = true})
  local opt = optim.SGD({w}, {lr = 0.5})
  local loss = (w * w):sum()
  loss:backward()
  opt:step()
  close(w, {0, 0}, 1e-7, 'one plain SGD step of lr 0.5 on w² lands at 0')
  local a = optim.Adam({w}, {lr = 0.1})
  local sched = optim.lr_scheduler(a, {schedule = 'cosine', steps = 10, warmup = 5})
  close(a:lr(), 0.02, 1e-12, 'warmup: step 1 of 5')
  for _ = 1, 4 do sched:step() end
  close(sched:get_last_lr(), 0.1, 1e-12, 'the peak at the end of warmup')
  for _ = 1, 5 do sched:step() end
  close(sched:get_last_lr(), 0.01, 1e-12, 'cosine to lr/10 at the last step')
  raises(function() optim.SGD({w}, {lr = 0.1, momentum = 0, nesterov = true}) end, 'optim.SGD: nesterov needs momentum > 0 and dampening 0')
  raises(function() optim.SGD({w}, {}) end, 'optim.SGD: lr must be a non-negative number (there is no default)')
  raises(function() optim.Adam({torch.zeros(2)}) end, 'optim.Adam: parameter 1 is not a tensor that requires grad')
  raises(function() optim.lr_scheduler({}, {steps = 3}) end, 'optim.lr_scheduler: the first argument must be an optimizer (optim.AdamW, optim.Adam, optim.SGD)')
end)

test('dtype = bf16 trains every seed architecture; VibeAttention under autocast is the composed ops', function()
  -- VibeAttention's one-node backward ran without autocast on tensors the
  -- forward had made in two dtypes, and failed ("expected scalar type Float
  -- but found BFloat16"): every VibeNet, the funnel, could not train in bf16.
  local c = data.from_string(sample_text)
  local V = c.vocab_size
  for name, make in pairs{
    plain = function() return models.vibenet{vocab = V, dim = 32, layers = 2, seq = 32, block = 'plain'} end,
    ffn = function() return models.vibenet{vocab = V, dim = 32, layers = 2, seq = 32, block = 'ffn'} end,
    gate = function() return models.vibenet{vocab = V, dim = 32, layers = 2, seq = 32, block = 'gate'} end,
    hyper = function() return models.vibenet{vocab = V, dim = 32, layers = 2, seq = 32, block = 'hyper', streams = 2} end,
    funnel = function() return models.funnel{vocab = V, seq = 32, widths = {32, 16, 8}, attentions = {1, 2, 3}} end,
    stateful = function() return models.stateful{vocab = V, dim = 32, heads = 2, layers = 2, seq = 32, ffn = 64} end,
  } do
    local f32, bf16 = H.fit_f32_bf16(make, c, 30, 3)
    close(bf16.train[1], f32.train[1], 0.02, name .. ': first loss in bf16 against float32')
    assert(bf16.train[30] < bf16.train[1] - 0.3, ('%s: the bf16 run learned: %.3f -> %.3f'):format(name, bf16.train[1], bf16.train[30]))
  end
  torch.manual_seed(4)
  local x = torch.randn(2, 6, 8)
  local function grad(f)
    local xi = x:clone():requires_grad_(true)
    local y = torch.autocast(torch.device():match('^%a+'), 'bfloat16', function() return f(xi) end)  -- x's device
    y:float():pow(2):sum():backward()
    return y, xi.grad
  end
  local y, g = grad(nn.VibeAttention())
  local mask = torch.ones(6, 6, {dtype = 'bool'}):triu(1)
  local y2, g2 = grad(function(t)
    return (t:matmul(t:transpose(2, 3)) * (1 / math.sqrt(8))):masked_fill(mask, -math.huge):softmax(-1):matmul(t)
  end)
  eq(y.dtype, y2.dtype, 'the output dtype autocast gives the composed ops')
  close(y, y2, 0, 'VibeAttention under autocast: the output')
  close(g, g2, 0, 'and the gradient')
end)

test('dtype = bf16: autocast compute, float32 master weights, the float32 loss curve within 0.02 nats over 100 steps', function()
  -- Tolerance: bfloat16 keeps 8 bits of mantissa; on this model the mean of
  -- the last 10 of 100 losses differs from float32's by ~3e-4 nats, the first
  -- loss by ~3e-5. 0.02 nats (0.01 on the first loss) fails a broken cast or
  -- a model that stopped learning, not rounding.
  local c = data.from_string(sample_text)
  local function run(dtype)
    torch.manual_seed(7)
    local m = models.gpt{vocab = c.vocab_size, seq = 32, dim = 64, layers = 2, heads = 4, ffn = 256}
    local r = train.fit(m, c, {steps = 100, batch = 8, seq = 32, lr = 3e-3, seed = 7, quiet = true, dtype = dtype, eval_every = 1000})
    local tail = 0
    for i = 91, 100 do tail = tail + r.train[i] end
    return r, tail / 10, m
  end
  local f32, f32_tail = run('float32')
  local bf16, bf16_tail, m = run('bf16')
  close(bf16.train[1], f32.train[1], 0.01, 'first loss')
  close(bf16_tail, f32_tail, 0.02, 'mean of the last 10 losses')
  assert(bf16.train[1] ~= f32.train[1], 'bf16 compute must change the loss at all (autocast is on)')
  assert(bf16_tail < f32.train[1] - 1.5, ('bf16 run learned: %.3f -> %.3f'):format(f32.train[1], bf16_tail))
  for name, p in m:named_parameters() do eq(p.dtype, 'float32', name .. ' stays float32') end
  for _, s in ipairs(bf16.optimizer._native:state()) do eq(s.exp_avg.dtype, 'float32', 'optimizer state') end
  -- autocast itself: a Linear inside computes in bfloat16, outside in float32
  local lin = nn.Linear(4, 3)
  local dt = torch.device():match('^%a+')  -- autocast's device type: the tensors' (cpu, accel or cuda)
  eq(torch.autocast(dt, 'bfloat16', function() return lin(torch.randn(2, 4)) end).dtype, 'bfloat16')
  eq(lin(torch.randn(2, 4)).dtype, 'float32')
  eq(torch.is_autocast_enabled(dt), false, 'autocast is off again')
  raises(function() torch.autocast(dt, nil, function() error('inside') end) end, 'inside')
  eq(torch.is_autocast_enabled(dt), false, 'and off after an error')
  if dt ~= 'cpu' then
    eq(torch.autocast('cpu', 'bfloat16', function() return lin(torch.randn(2, 4)) end).dtype, 'float32', "cpu autocast leaves " .. dt .. " tensors alone")
  end
  raises(function() torch.autocast('tpu', nil, function() end) end, "bad argument #1 to 'autocast' (device_type must be 'cpu', 'cuda' or 'accel', got 'tpu')")
  raises(function() torch.autocast('cpu', 'int64', function() end) end, "bad argument #2 to 'autocast' (autocast computes in bfloat16 or float16, got int64)")
  raises(function() train.fit(m, c, {steps = 1, dtype = 'float16', quiet = true}) end,
    "train.fit: dtype 'float16' needs loss scaling, which train.fit does not do; use dtype = 'bf16' (same range as float32)")
  raises(function() train.fit(m, c, {steps = 1, dtype = 'int8', quiet = true}) end, "train.fit: unknown dtype 'int8', expected 'float32' or 'bf16' (also spelt 'bfloat16')")
end)

test('capturable AdamW (for CUDA graphs) takes the same steps as LibTorch AdamW', function()
  local function run(capturable)
    torch.manual_seed(1)
    local m = nn.Sequential{nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4)}
    local opt = optim.AdamW(m, {lr = 1e-2, weight_decay = 0.1, decay = 'matrices'})
    local x = torch.randn(8, 6)
    for s = 1, 20 do
      if s == 5 and capturable then opt:set_capturable(true) end  -- moments and count carried over
      if s == 15 then opt:set_lr(3e-3) end                          -- a new lr reaches the tensor it reads
      opt:zero_grad()
      m(x):pow(2):mean():backward()
      opt:step()
    end
    return m, opt
  end
  local a, oa = run(false)
  local b, ob = run(true)
  local pa, pb = a:parameters(), b:parameters()
  for i = 1, #pa do close((pa[i] - pb[i]):abs():max():item(), 0, 1e-6, 'parameter ' .. i) end
  eq(ob:state_tensors()['optim.1.step']:item(), 20, 'step count')
  ob:set_capturable(false)
  eq(ob:state_tensors()['optim.1.step']:item(), 20, 'written back')
  eq(oa:state_tensors()['optim.1.step']:item(), 20)
  raises(function() ob:set_capturable(1) end, "bad argument #1 to 'set_capturable' (boolean expected, got number)")
end)

test('AdamW on a device is one fused call a group: the same steps as on the CPU, its state read and restored', function()
  local ok = pcall(torch.device, 'accel')
  if not ok then H.skip('no second device here (accel needs LibTorch 2.1 or later; its fused kernel 2.4)') end
  local dev = torch.device() ~= 'cpu' and torch.device() or 'accel'
  local function run(device, steps)
    local was = torch.device()
    torch.set_default_device('cpu')  -- the same initial weights and batch, moved
    torch.manual_seed(1)
    local m = nn.Sequential{nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4), nn.Linear(4, 4)}
    local x = torch.randn(8, 6)
    torch.set_default_device(was)
    m:to(device)
    x = x:to(device)
    local opt = optim.AdamW(m, {lr = 1e-2, weight_decay = 0.1, decay = 'matrices'})
    local counts
    for s = 1, steps do
      if s == 12 then opt:set_lr(3e-3) end
      opt:zero_grad()
      m(x):pow(2):mean():backward()
      if s == 2 then counts = torch.profiler.count_ops(opt.step, opt) else opt:step() end
    end
    return m, opt, counts
  end
  local a, oa = run('cpu', 20)
  local b, ob, counts = run(dev, 20)
  local pa, pb = a:parameters(), b:parameters()
  for i = 1, #pa do close((pa[i] - pb[i]:to('cpu')):abs():max():item(), 0, 1e-6, 'parameter ' .. i) end
  -- 6 parameters in two groups: one count update and one fused update each, not a dozen operators a parameter
  eq(counts.by_name['aten::_fused_adamw_'], 2, 'one fused call a group')
  assert(counts.ops <= 8, 'operators in one step on ' .. dev .. ': ' .. counts.ops)
  eq(counts.syncs, 0, 'and nothing read back')
  eq(ob:state_tensors()['optim.1.step']:item(), 20, 'the host keeps the count')
  close(ob:state_tensors()['optim.1.exp_avg']:to('cpu'), oa:state_tensors()['optim.1.exp_avg'], 1e-6, 'the moments')
end)

test("the GPU's bookkeeping (losses read one step late, ids checked once) gives the same run", function()
  -- train.fit's GPU path, run on the CPU: every loss, evaluation and checkpoint
  -- must be those of the ordinary path, to the bit.
  local c = data.from_string(sample_text)
  local function run(gpu_paths, ckpt)
    torch.manual_seed(5)
    local m = models.gpt{vocab = c.vocab_size, dim = 16, heads = 2, layers = 1, seq = 16, ffn = 32}
    return train.fit(m, c, {steps = 12, batch = 4, lr = 3e-3, seed = 5, eval_every = 5, quiet = true,
      checkpoint = ckpt, checkpoint_every = 4, _gpu_paths = gpu_paths}), m
  end
  local p1, p2 = os.tmpname(), os.tmpname()
  os.remove(p1); os.remove(p2)
  local a = run(false, p1)
  local b = run(true, p2)
  eq(#b.train, 12)
  for i = 1, 12 do eq(b.train[i], a.train[i], 'loss at step ' .. i) end
  eq(#b.val, #a.val)
  for i = 1, #a.val do eq(b.val[i].step, a.val[i].step); eq(b.val[i].loss, a.val[i].loss) end
  local ta, tb = torch.load_safetensors(p1), torch.load_safetensors(p2)
  for name, t in pairs(ta) do
    if name ~= 'rng' then eq((t:double() - tb[name]:double()):abs():max():item(), 0, name) end
  end
  os.remove(p1); os.remove(p2)
  -- a model whose table is smaller than the corpus's ids is refused before any step
  torch.manual_seed(5)
  local small = models.gpt{vocab = c.vocab_size - 1, dim = 16, heads = 2, layers = 1, seq = 16, ffn = 32}
  raises(function() train.fit(small, c, {steps = 2, quiet = true, _gpu_paths = true}) end,
    ("train.fit: the corpus's token ids (1..%d) do not fit the model: bad argument #1 to 'forward' (token id %d is out of range 1..%d (ids are 1-based))")
      :format(c.vocab_size, c.vocab_size, c.vocab_size - 1))
end)

-- The metrics log a run killed mid-write leaves: its last line cut short.
test('train.read_metrics skips a last line cut short and refuses a bad line elsewhere', function()
  local path = os.tmpname()
  local f = io.open(path, 'wb')
  f:write('{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.25}\n{"step": 3, "lo')
  f:close()
  local r = train.read_metrics(path)
  eq(#r, 2)
  eq(r[2].loss, 2.25)
  f = io.open(path, 'wb')
  f:write('{"step": 1}\nnot json\n{"step": 3}\n')
  f:close()
  raises(function() train.read_metrics(path) end, ('train.read_metrics: %s: line 2 is not a JSON object: json.decode: unexpected \'n\' at byte 1'):format(path))
  os.remove(path)
  raises(function() train.read_metrics(path) end, ('train.read_metrics: cannot open %s: No such file or directory'):format(path))
end)

test('keep_checkpoints needs a checkpoint, and is a boolean', function()
  local corpus = data.from_string(string.rep('abcdefgh', 40))
  local m = models.gpt{vocab = corpus.vocab_size, dim = 8, heads = 2, layers = 1, seq = 8, ffn = 16}
  H.raises(function() train.fit(m, corpus, {steps = 1, keep_checkpoints = true, quiet = true}) end,
    'train.fit: keep_checkpoints needs checkpoint (the file whose copies it keeps)')
  H.raises_part(function() train.fit(m, corpus, {steps = 1, keep_checkpoints = 'yes', quiet = true}) end, 'keep_checkpoints')
end)

H.done()
