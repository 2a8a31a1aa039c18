-- train: the training loop (AdamW, schedules, clipping, evaluation,
-- checkpoints that resume exactly), evaluation of a model on a text, and
-- checks that stop at the first NaN with its place named.
local measure = require 'anatomy.autopsy.measure'
local train_log = require 'anatomy.train.log'

local train = {}
train.read_metrics = train_log.read  -- the JSON-lines log train.fit writes (train/log.lua)
train.export_metrics = train_log.export

local defaults = {
  steps = 1000, batch = 32, lr = 3e-3, weight_decay = 0.1, betas = {0.9, 0.95}, warmup = 0,
  schedule = 'cosine', clip = 1.0, eval_batches = 8, resume = true, decay = 'matrices',
}
local known = {
  steps = true, batch = true, seq = true, lr = true, weight_decay = true, betas = true, warmup = true,
  schedule = true, clip = true, eval_every = true, eval_batches = true, log_every = true, seed = true,
  checkpoint = true, checkpoint_every = true, resume = true, on_step = true, log = true, decay = true,
  quiet = true, recurrence = true, probe = true, seconds = true, dtype = true, cuda_graph = true,
  bucket_mb = true,
  _gpu_paths = true,  -- tests only: the GPU's bookkeeping (one-step-late reads, trusted ids) on any device
}

-- train.fit's dtype: what the forward pass computes in. Parameters, gradients
-- and the optimizer's state stay float32 (master weights) in every case.
local compute_dtypes = {float32 = 'float32', float = 'float32', bf16 = 'bfloat16', bfloat16 = 'bfloat16'}

-- What each option must be, checked when train.fit is called (so that a
-- string lr is train.fit's error, not optim.AdamW's argument #3 later).
local kinds = {
  steps = 'count', batch = 'count', seq = 'count', eval_every = 'count', eval_batches = 'count', log_every = 'count',
  recurrence = 'count', warmup = 'whole', seed = 'integer', lr = 'positive', clip = 'nonnegative', seconds = 'positive',
  weight_decay = 'nonnegative', resume = 'boolean', quiet = 'boolean', on_step = 'function', probe = 'table',
  schedule = {'cosine', 'constant'}, decay = {'matrices', 'all'},
}
local function check_kind(key, v)
  local kind = kinds[key]
  if v == nil or kind == nil then return end
  local finite = type(v) == 'number' and v == v and v > -math.huge and v < math.huge
  local ok, want
  if kind == 'count' then ok, want = finite and v >= 1 and v % 1 == 0, 'a positive integer'
  elseif kind == 'whole' then ok, want = finite and v >= 0 and v % 1 == 0, 'a non-negative integer'
  elseif kind == 'integer' then ok, want = finite and v % 1 == 0, 'an integer'
  elseif kind == 'positive' then ok, want = finite and v > 0, 'a positive number'
  elseif kind == 'nonnegative' then ok, want = finite and v >= 0, 'a non-negative number'
  elseif type(kind) == 'table' then
    ok = false
    for _, k in ipairs(kind) do ok = ok or v == k end
    want = "'" .. table.concat(kind, "' or '") .. "'"
  else ok, want = type(v) == kind, 'a ' .. kind end
  if not ok then
    local got = type(v) == 'string' and ("the string '%s'"):format(v) or (type(v) == 'number' and tostring(v) or type(v))
    error(('train.fit: option %s must be %s, got %s'):format(key, want, got), require('anatomy.torch.options').user_level() + 1)
  end
end

local function options(opts, model)
  opts = require('anatomy.torch.options').check(opts, known, 'train.fit', 3)
  for k, v in pairs(opts) do check_kind(k, v) end
  if opts.betas ~= nil then
    local b = opts.betas
    if type(b) ~= 'table' or #b ~= 2 or type(b[1]) ~= 'number' or type(b[2]) ~= 'number' or not (b[1] >= 0 and b[1] < 1 and b[2] >= 0 and b[2] < 1) then
      error(('train.fit: option betas must be two numbers in [0, 1), got %s'):format(type(b) == 'table' and
        ('{' .. table.concat((function() local t = {} for i, x in ipairs(b) do t[i] = tostring(x) end return t end)(), ', ') .. '}') or type(b)), 3)
    end
  end
  local o = {}
  for k, v in pairs(defaults) do o[k] = v end
  for k, v in pairs(opts) do o[k] = v end
  o.seq = o.seq or model:context() or 64
  o.eval_every = o.eval_every or math.max(1, math.floor(o.steps / 10))
  o.log_every = o.log_every or math.max(1, math.floor(o.steps / 50))
  for _, key in ipairs{'checkpoint', 'log'} do
    if o[key] ~= nil and (type(o[key]) ~= 'string' or o[key] == '') then
      error(('train.fit: %s must be a file path (a non-empty string), got %s'):format(key,
        type(o[key]) == 'string' and 'an empty string' or type(o[key])), 3)
    end
  end
  if o.checkpoint_every ~= nil and not (type(o.checkpoint_every) == 'number' and o.checkpoint_every >= 1 and o.checkpoint_every % 1 == 0) then
    error(('train.fit: checkpoint_every must be a positive integer, got %s'):format(tostring(o.checkpoint_every)), 3)
  end
  local dtype = o.dtype or 'float32'
  if dtype == 'float16' or dtype == 'fp16' or dtype == 'half' then
    error(("train.fit: dtype '%s' needs loss scaling, which train.fit does not do; use dtype = 'bf16' (same range as float32)"):format(dtype), 3)
  end
  o.compute_dtype = compute_dtypes[dtype]
  if not o.compute_dtype then
    error(("train.fit: unknown dtype '%s', expected 'float32' or 'bf16'"):format(tostring(dtype)), 3)
  end
  if o.cuda_graph ~= nil and type(o.cuda_graph) ~= 'boolean' then
    error(('train.fit: cuda_graph must be a boolean, got %s'):format(type(o.cuda_graph)), 3)
  end
  if o.cuda_graph then
    if not torch.cuda.is_available() then
      error('train.fit: cuda_graph = true needs a GPU: ' .. (torch.version.cuda
        and ('this LibTorch has CUDA ' .. torch.version.cuda .. ', but no GPU is visible')
        or ('this anatomy is built against LibTorch ' .. torch.__version__ .. ' without CUDA (scripts/setup --torch=cuda builds the CUDA one)')), 3)
    end
    if not torch.device():match('^cuda') then
      error(("train.fit: cuda_graph = true needs the model on the GPU, but the default device is '%s' (--device=cuda)"):format(torch.device()), 3)
    end
    if o.recurrence then error('train.fit: cuda_graph = true cannot record recurrence (each pass depends on the last)', 3) end
    if dist.world_size() > 1 then error('train.fit: cuda_graph = true cannot record the all-reduce of a data-parallel run', 3) end
  end
  if o.bucket_mb ~= nil and not (type(o.bucket_mb) == 'number' and o.bucket_mb > 0) then
    error(('train.fit: bucket_mb must be a positive number of MiB, got %s'):format(tostring(o.bucket_mb)), 3)
  end
  return o
end

-- Runs the model once more with every module's output checked; returns the
-- dotted name and class of the first module whose output is not finite.
function train.find_nonfinite(model, x)
  local found
  local handle = probe.watch(model, function(name, y, m)
    if found == nil and torch.is_tensor(y) and y:is_floating_point() and not y:isfinite():all():item() then
      found = ('%s (%s)'):format(name, nn.typename(m))
    end
  end)
  local ok, err = pcall(function() torch.no_grad(function() model(x) end) end)
  handle:remove()
  if not ok then error(err, 0) end
  return found
end

-- The first parameter (by name) whose gradient is not finite.
local function first_bad_grad(model)
  for name, p in model:named_parameters() do
    if p.grad ~= nil and not p.grad:isfinite():all():item() then return name end
  end
end

-- Windows of seq + 1 tokens laid end to end over ids, at most `limit` of
-- them: deterministic, and drawing nothing from the random generator.
local function windows(ids, seq, limit)
  local n = math.floor((ids:numel() - 1) / seq)
  if limit then n = math.min(n, limit) end
  if n < 1 then return nil end
  local x = ids:narrow(1, 1, n * seq):view(n, seq)
  local y = ids:narrow(1, 2, n * seq):view(n, seq)
  return x, y
end

-- train.evaluate(model, corpus, {split = 'val', text = nil, seq, batches = 8, batch = 16})
-- -> {nats = mean cross-entropy per token, bits = the same in bits, tokens = count}.
-- With text, the model is judged on that text (encoded with the corpus's
-- tokenizer), such as samples from another model.
function train.evaluate(model, corpus, opts)
  opts = opts or {}
  local seq = opts.seq or model:context() or 64
  local ids = opts.text and corpus:encode(opts.text) or corpus:tokens(opts.split or 'val')
  -- _world (train.fit's, data-parallel): each rank judges its share of the
  -- windows one process would, and the sums are added over the ranks
  local world, rank = opts._world or 1, opts._world and dist.rank() or 0
  local x, y = windows(ids, seq, (opts.batches or 8) * (opts.batch or 16) * world)
  if x and world > 1 then
    local n = x:size(1)
    local first, last = math.floor(n * rank / world) + 1, math.floor(n * (rank + 1) / world)
    if last < first then x, y = nil, nil else x, y = x:narrow(1, first, last - first + 1), y:narrow(1, first, last - first + 1) end
    if x == nil then error('train.evaluate: fewer evaluation windows than ranks', 2) end
  end
  if not x then
    seq = ids:numel() - 1
    if seq < 1 then error('train.evaluate: the text has fewer than 2 tokens', 2) end
    x, y = ids:narrow(1, 1, seq):view(1, seq), ids:narrow(1, 2, seq):view(1, seq)
  end
  local was_training = model.training
  model:eval()
  local total, count = 0, 0
  torch.no_grad(function()
    local B = opts.batch or 16
    for first = 1, x:size(1), B do
      local n = math.min(B, x:size(1) - first + 1)
      local xb, yb = x:narrow(1, first, n), y:narrow(1, first, n)
      if torch.device() ~= 'cpu' then xb, yb = xb:to(torch.device()), yb:to(torch.device()) end
      local loss = nn.functional.cross_entropy((model(xb)), yb)  -- (...): the logits alone
      total = total + loss:item() * yb:numel()
      count = count + yb:numel()
    end
  end)
  model:train(was_training)
  if world > 1 then
    local sums = dist.all_reduce(torch.tensor({total, count}, {dtype = 'float64'}), {op = 'sum'}):tolist()
    total, count = sums[1], sums[2]
  end
  local nats = total / count
  return {nats = nats, bits = nats / math.log(2), tokens = count}
end

-- train.save_checkpoint(path, model, opt, step, metadata): model, optimizer
-- state, RNG state and step in one safetensors file, written atomically.
function train.save_checkpoint(path, model, opt, step, metadata)
  local tensors = {}
  for name, p in model:named_parameters() do tensors['model.' .. name] = p:detach() end
  for name, t in pairs(opt:state_tensors('optim.')) do tensors[name] = t end
  tensors.rng = torch.get_rng_state()
  local meta = {format = 'anatomy-checkpoint', step = tostring(step), class = nn.typename(model)}
  for k, v in pairs(metadata or {}) do meta[k] = tostring(v) end
  torch.save_safetensors(path, tensors, meta)
end

-- train.load_checkpoint(path, model, opt) -> step, metadata
function train.load_checkpoint(path, model, opt)
  local t, meta = torch.load_safetensors(path)
  if meta.format ~= 'anatomy-checkpoint' then error(("'%s' is not an anatomy checkpoint"):format(path), 2) end
  local sd = {}
  for name, v in pairs(t) do
    local n = name:match('^model%.(.*)$')
    if n then sd[n] = v end
  end
  model:load_state_dict(sd)
  if opt then opt:load_state_tensors(t, 'optim.') end
  torch.set_rng_state(t.rng)
  return tonumber(meta.step), meta
end


local function format_time(seconds)
  seconds = math.max(0, math.floor(seconds + 0.5))
  if seconds >= 3600 then return ('%d:%02d:%02d'):format(seconds / 3600, seconds % 3600 / 60, seconds % 60) end
  return ('%d:%02d'):format(seconds / 60, seconds % 60)
end

local Run = {}
Run.__index = Run
train.Run = Run

function Run:__tostring()
  local last_val = self.val[#self.val]
  return ('train.Run(%d steps%s, train loss %.4f%s, %.1f s, %.0f tokens/s)'):format(
    self.steps, self.interrupted and ', interrupted' or '', self.train[#self.train] or 0 / 0,
    last_val and (', val loss %.4f'):format(last_val.loss) or '', self.seconds, self.tokens_per_second)
end

-- train.fit(model, corpus, opts) -> run
-- opts: steps, batch, seq, lr, weight_decay, betas, warmup, schedule ('cosine'|
-- 'constant'), clip, eval_every, eval_batches, log_every, seed, checkpoint
-- (path), checkpoint_every, resume (default true), on_step(step, info), log
-- (a JSON-lines file), decay ('matrices'|'all'), quiet, recurrence (k extra
-- passes of a stateful model, fed its previous pass's hidden states), probe
-- ({every = 50, filter, grad, fn(step, capture, record)}: captures during
-- that step's own forward and backward, at step 1 and every `every` steps),
-- seconds (a time budget: stop after the first step that ends past it),
-- dtype ('float32', or 'bf16': the forward pass under autocast, float32 master
-- weights), cuda_graph (true: on a GPU, one whole step recorded after two
-- warm-up steps and replayed; probe steps run outside it).
-- bucket_mb (data-parallel: the size of a gradient bucket, default 25 MiB).
-- Under a world of N ranks (anatomy --nproc N, or a launcher's environment),
-- batch is each rank's: rank 0's weights are broadcast, every rank draws the
-- N x batch rows of one random stream and trains on its own, gradients are
-- averaged in buckets as backward produces them, the loss and evaluation are
-- averaged over the ranks, and rank 0 alone prints, logs and checkpoints;
-- resuming needs the same N. run.communication = {buckets, wait_seconds, seconds}.
-- The run: train (loss per step), val ({step, loss} per evaluation), steps,
-- seconds, tokens_per_second, interrupted (Ctrl-C stopped it at a step boundary),
-- depth_losses (with recurrence: per step, the loss of each pass, depth 0 first),
-- probes (with probe: per probed step, {step, grad_norm = {param = norm}, act_std = {point = std}}).
function train.fit(model, corpus, opts)
  local o = options(opts, model)
  if o.seed then torch.manual_seed(o.seed) end
  model:train()
  local params = model:parameters()
  -- Data-parallel (a world of several ranks): every rank starts from rank 0's
  -- weights, draws the batch of all ranks from one random stream and trains
  -- on its own rows; gradients are averaged as backward produces them.
  local world, rank = dist.world_size(), dist.rank()
  local reducer
  if world > 1 then
    for _, p in ipairs(params) do dist.broadcast(p, 0) end
    reducer = torch._dist._reducer(params, o.bucket_mb or 25)
    o.quiet = o.quiet or rank ~= 0  -- rank 0 alone prints, logs and checkpoints
  end
  local main = rank == 0
  local opt = optim.AdamW(params, {lr = o.lr, betas = o.betas, weight_decay = o.weight_decay, decay = o.decay})
  local lr_at = optim.schedule(o.schedule, o.lr, o.steps, o.warmup)  -- replaced when resuming a run of another length
  -- the run's settings, saved in every checkpoint's metadata as config.<key>
  local config = {}
  for k, v in pairs(o) do
    if type(v) == 'number' or type(v) == 'string' or type(v) == 'boolean' then config['config.' .. k] = v end
  end
  if rawget(model, 'config') then
    for k, v in pairs(model.config) do
      if type(v) ~= 'table' then config['model.' .. k] = v end
    end
  end
  config['config.world_size'] = world
  local run = setmetatable({train = {}, val = {}, depth_losses = {}, probes = {}, steps = 0, seconds = 0,
    tokens_per_second = 0, first_step = 1, config = config, world_size = world}, Run)
  -- what the probes capture by default: the output of every layer of the stack
  local probe_filter
  local layers = o.probe and not o.probe.filter and model:layers()
  if layers then
    probe_filter = {}
    for _, l in ipairs(layers) do probe_filter[#probe_filter + 1] = l[1] end
  end
  if o.recurrence and not (o.recurrence >= 1 and o.recurrence % 1 == 0) then
    error('train.fit: recurrence must be a positive integer', 2)
  end
  if o.recurrence and not model.step then
    error(('train.fit: recurrence needs a stateful model (models.stateful), got %s'):format(nn.typename(model)), 2)
  end

  local time_before = 0   -- seconds the resumed run had trained: the log's time goes on from there
  -- what a writer killed mid-write left beside the checkpoint and the log
  if main and o.checkpoint then require('anatomy.io.fs').remove_stale(o.checkpoint) end
  if main and o.log then require('anatomy.io.fs').remove_stale(o.log) end
  local resuming = o.checkpoint and o.resume and require('anatomy.io.fs').exists(o.checkpoint)
  if world > 1 and o.checkpoint and o.resume then
    -- every rank reads the checkpoint rank 0 wrote (one machine, or a shared file system)
    local found = dist.all_gather(torch.tensor({resuming and 1 or 0}))
    for r, f in ipairs(found) do
      if f:item() ~= found[1]:item() then
        error(('train.fit: rank %d %s the checkpoint %s, rank 0 %s: resuming needs it on a file system every rank reads')
          :format(r - 1, f:item() == 1 and 'finds' or 'does not find', o.checkpoint, found[1]:item() == 1 and 'does' or 'does not'), 2)
      end
    end
  end
  if resuming then
    local step, meta = train.load_checkpoint(o.checkpoint, model, opt)
    local saved_world = tonumber(meta['config.world_size']) or 1
    if saved_world ~= world then
      error(('train.fit: the checkpoint %s was written by a run of %d rank%s; resume it with the same number (this run has %d): each rank\'s batch is its share of one random stream')
        :format(o.checkpoint, saved_world, saved_world == 1 and '' or 's', world), 2)
    end
    run.first_step = step + 1
    run.resumed_from = step
    time_before = tonumber(meta.time) or 0
    if not o.quiet then print(('resuming from %s at step %d'):format(o.checkpoint, step)) end
    -- A run resumed for more (or fewer) steps keeps the schedule it was
    -- trained on up to that run's end; past it, the learning rate stays at
    -- the schedule's last value rather than jumping back up.
    local old_steps = tonumber(meta['config.steps'])
    if old_steps and old_steps ~= o.steps then
      local old_lr_at = optim.schedule(meta['config.schedule'] or o.schedule, tonumber(meta['config.lr']) or o.lr,
        old_steps, tonumber(meta['config.warmup']) or o.warmup)
      lr_at = function(s) return old_lr_at(math.min(s, old_steps)) end
      if not o.quiet then
        print(('the checkpoint is of a %d-step run; resumed for %d steps: its %s schedule is kept to step %d, then lr stays at %.4g')
          :format(old_steps, o.steps, meta['config.schedule'] or o.schedule, old_steps, old_lr_at(old_steps)))
      end
      run.config['config.steps'] = old_steps  -- later checkpoints keep describing the schedule in use
      run.config['config.resumed_steps'] = o.steps
    end
  end
  local log = o.log and main and train_log.open(o.log, run.resumed_from)
  local tty = torch._isatty(1) and not o.quiet
  local started = torch._now()
  run.started, run.started_utc = started, os.date('!%Y-%m-%dT%H:%M:%SZ')  -- this run's own (an autopsy of it records them)
  local tokens = 0
  local steps_done = 0

  -- The forward pass, in autocast when dtype asks for it; the loss is taken
  -- in float32 from the logits either way.
  local device_type = torch.device():match('^cuda') and 'cuda' or 'cpu'
  local autocast = o.compute_dtype ~= 'float32' and o.compute_dtype or nil
  local function forward(x, hidden)
    if not autocast then return model(x, hidden) end
    return torch.autocast(device_type, autocast, function() return model(x, hidden) end)
  end
  local function loss_of(logits, y)
    if autocast then logits = logits:float() end
    return nn.functional.cross_entropy(logits, y)
  end
  -- On a GPU the range checks of token ids and targets would read every batch
  -- back to the host. Every id of a batch is one of the corpus's, so the
  -- corpus's smallest and largest id go through the model once, checked; the
  -- run then trains with GPU ids trusted (host/runtime.h, TrustedIds).
  local gpu_paths = device_type == 'cuda' or o._gpu_paths
  if gpu_paths then
    local ids = corpus:tokens()
    local probe_ids = torch.full({1, o.seq}, ids:min():item(), {dtype = 'int64'})
    probe_ids:narrow(2, o.seq, 1):fill_(ids:max():item())
    local was_training = model.training
    model:eval()
    local ok, err = pcall(torch.no_grad, function()  -- the ids as inputs and as targets
      local p = probe_ids:to(torch.device())
      nn.functional.cross_entropy((model(p)), p)
    end)
    model:train(was_training)
    if not ok then
      error(('train.fit: the corpus\'s token ids (%d..%d) do not fit the model: %s'):format(
        ids:min():item(), ids:max():item(), tostring(err):gsub('^[^:]*:%d+: ', '')), 0)
    end
    local plain_forward, plain_loss = forward, loss_of
    forward = function(x, hidden) return torch._native.with_trusted_ids(plain_forward, x, hidden) end
    loss_of = function(logits, y) return torch._native.with_trusted_ids(plain_loss, logits, y) end
  end
  local function check_loss(value, step, x)
    if value ~= value or value == math.huge or value == -math.huge then
      local where = train.find_nonfinite(model, x)
      error(('train.fit: the loss is %s at step %d; first non-finite value in the output of %s'):format(
        tostring(value), step, where or 'no module (the loss itself)'), 0)
    end
  end
  local function check_norm(norm, step)
    if norm ~= norm or norm == math.huge then
      error(('train.fit: the gradient of %s is not finite at step %d'):format(first_bad_grad(model) or '?', step), 0)
    end
  end

  -- On a GPU the loss and gradient norm of a step are read back one step
  -- late, once the next step's work is queued, so the GPU never waits for the
  -- host (a step with an evaluation, a checkpoint or on_step is read at once).
  local defer = gpu_paths and not o.on_step and world == 1
  if o.cuda_graph then opt:set_capturable(true) end
  -- cuda_graph: after two ordinary steps (warm-up), one step (forward,
  -- backward, clipping, optimizer) is recorded once and replayed on fresh
  -- batches copied into its input; probe steps run outside it.
  local graph
  local function graph_step(x, y)
    if not graph then
      local static = {x = x:clone(), y = y:clone(), graph = torch.cuda.CUDAGraph()}
      static.graph:capture_begin()
      local ok, err = pcall(function()
        opt:zero_grad()
        local loss = loss_of((forward(static.x)), static.y)
        loss:backward()
        static.norm = optim.clip_grad_norm_(params, o.clip)
        opt:step()
        static.loss = loss:detach()
      end)
      if not ok then
        static.graph:reset()
        error('train.fit: recording the training step in a CUDA graph failed: ' .. tostring(err), 0)
      end
      static.graph:capture_end()
      graph = static
    end
    graph.x:copy_(x)
    graph.y:copy_(y)
    graph.graph:replay()
    return graph.loss:clone(), graph.norm:clone()  -- the graph's own outputs are overwritten by the next replay
  end

  -- Queues one step; returns what finish() reports of it.
  local function step_once(step)
    local lr = lr_at(step)
    opt:set_lr(lr)
    local x, y = corpus:batch(o.batch * world, o.seq)
    if world > 1 then  -- this rank's rows of the batch of all ranks
      x, y = x:narrow(1, rank * o.batch + 1, o.batch), y:narrow(1, rank * o.batch + 1, o.batch)
    end
    local r = {step = step, lr = lr, x = x}
    tokens = tokens + o.batch * world * o.seq * (1 + (o.recurrence or 0))
    -- probes ride along on this step's own forward and backward: no extra pass
    local capture, capture_handle
    if o.probe and (step % (o.probe.every or 50) == 0 or step == 1) then
      capture, capture_handle = probe.attach_capture(model, {filter = o.probe.filter or probe_filter, grad = o.probe.grad})
    end
    if o.cuda_graph and not capture_handle and step >= run.first_step + 2 then
      r.loss, r.norm = graph_step(x, y)
      return r
    end
    opt:zero_grad()
    -- One ordinary pass; with recurrence = k (a stateful model), k more passes
    -- that take the previous pass's last hidden states, each with its own
    -- loss and backward. The step's loss is the deepest pass's.
    local hidden
    for depth = 0, o.recurrence or 0 do
      local logits, h = forward(x, hidden)
      local loss = loss_of(logits, y)
      if not defer or o.recurrence then
        r.value = loss:item()
        check_loss(r.value, step, x)
      end
      if reducer and depth == (o.recurrence or 0) then reducer:prepare() end  -- the last pass's backward
      loss:backward()
      r.loss = loss:detach()
      if o.recurrence then
        r.depth_losses = r.depth_losses or {}
        r.depth_losses[depth + 1] = r.value
        hidden = h:detach()
      end
    end
    if reducer then
      reducer:finish()  -- the gradients are now the average over the ranks
      -- alike on every rank by construction: without the ranks' comparison of the call (a round trip a step)
      local mean = torch._dist.all_reduce(r.loss:clone(), 'avg', false)
      r.loss, r.value = mean, mean:item()
      if r.depth_losses then r.depth_losses[#r.depth_losses] = r.value end
    end
    if capture_handle then
      capture_handle:remove()
      -- the autopsy's own per-step measures: fused gradient norms, stds read back together
      local record = measure.probe_record(model, step, capture, world > 1)
      if o.probe.fn then o.probe.fn(step, capture, record) end
      run.probes[#run.probes + 1] = record
    end
    r.norm = optim.clip_grad_norm_(params, o.clip)
    if not defer then
      r.norm_value = r.norm:item()
      check_norm(r.norm_value, step)
    end
    opt:step()
    return r
  end

  -- Reads a queued step's loss and norm, and reports it: the run's record,
  -- evaluation, the log, the progress line, the checkpoint, on_step.
  local function finish(r)
    local step = r.step
    if not r.value then
      r.value = r.loss:item()
      check_loss(r.value, step, r.x)
    end
    if not r.norm_value then
      r.norm_value = r.norm:item()
      check_norm(r.norm_value, step)
    end
    local value, lr, norm = r.value, r.lr, r.norm_value
    if r.depth_losses then run.depth_losses[#run.depth_losses + 1] = r.depth_losses end
    steps_done = steps_done + 1
    run.train[#run.train + 1] = value
    run.steps = step
    local info = {step = step, loss = value, lr = lr, grad_norm = norm}
    if step % o.eval_every == 0 or step == o.steps then
      info.val_loss = train.evaluate(model, corpus, {seq = o.seq, batches = o.eval_batches, batch = o.batch,
        _world = world > 1 and world or nil}).nats
      run.val[#run.val + 1] = {step = step, loss = info.val_loss}
    end
    local elapsed = torch._now() - started
    info.tokens_per_second = tokens / math.max(elapsed, 1e-9)
    if log then
      log:write(('{"step": %d, "loss": %.9g, "lr": %.6g, "grad_norm": %.6g%s, "tokens_per_second": %.1f, "time": %.3f}\n')
        :format(step, value, lr, norm, info.val_loss and (', "val_loss": %.9g'):format(info.val_loss) or '',
          info.tokens_per_second, time_before + elapsed))
      log:flush()
    end
    if not o.quiet then
      local eta = elapsed / steps_done * (o.steps - step)
      local last_val = run.val[#run.val]
      local line = ('step %d/%d | loss %.4f%s | %.0f tok/s | ETA %s'):format(step, o.steps, value,
        last_val and (' | val %.4f'):format(last_val.loss) or '', info.tokens_per_second, format_time(eta))
      if tty then
        io.write('\r\27[K' .. line)
        if step == o.steps then io.write('\n') end
        io.flush()
      elseif step % o.log_every == 0 or step == o.steps or info.val_loss then
        print(line)
      end
    end
    if main and o.checkpoint and ((o.checkpoint_every and step % o.checkpoint_every == 0) or step == o.steps) then
      local meta = {time = ('%.3f'):format(time_before + elapsed)}
      for k, v in pairs(run.config) do meta[k] = v end
      -- the log first: once the checkpoint names a step, the log holds it
      if log then require('anatomy.io.fs').sync(o.log) end
      train.save_checkpoint(o.checkpoint, model, opt, step, meta)
    end
    if o.on_step then o.on_step(step, info) end
  end
  -- a step whose report needs the model as it is right after it
  local function due(step)
    return step == o.steps or step % o.eval_every == 0 or (o.checkpoint and o.checkpoint_every and step % o.checkpoint_every == 0)
  end

  local pending
  for step = run.first_step, o.steps do
    local ok, err = pcall(function()
      local r = step_once(step)
      if pending then
        local p = pending
        pending = nil
        finish(p)
      end
      if defer and not due(step) then pending = r else finish(r) end
    end)
    if not ok then
      if tostring(err):match('interrupted$') and world == 1 then
        if pending then pcall(finish, pending) end
        run.interrupted = true
        if tty then io.write('\n') end
        print(('interrupted at step %d: the model keeps what it learned in %d steps'):format(step, step - 1))
        pending = nil
        break
      end
      if log then log:close() end
      error(err, 0)
    end
    if o.seconds and torch._now() - started >= o.seconds then break end
  end
  if pending then
    local ok, err = pcall(finish, pending)
    if not ok then
      if log then log:close() end
      error(err, 0)
    end
  end
  if o.cuda_graph then opt:set_capturable(false) end
  if log then log:close() end
  run.seconds = torch._now() - started
  run.total_seconds = time_before + run.seconds  -- with the time of the run it resumed
  run.tokens_per_second = tokens / math.max(run.seconds, 1e-9)
  run.optimizer = opt
  if reducer then
    local waited, communicated = reducer:stats()
    run.communication = {buckets = reducer:buckets(), wait_seconds = waited, seconds = communicated}
    reducer:release()
  end
  return run
end

return train
