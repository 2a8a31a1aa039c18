-- Trainer: one run of train.fit as an object whose phases are its methods,
-- read top to bottom like a training script: new (the optimizer, the
-- schedule, the run's record), resume (from the checkpoint), prepare (the
-- forward pass: autocast, the GPU's trusted ids), then for each step `step`
-- (queue the work) and `report` (read the loss, evaluate, log, print,
-- checkpoint), and `close`. Data parallelism is train/parallel.lua's.
local torch = require('anatomy.torch')
local native = require('anatomy.torch.native')
local nn = require('anatomy.nn')
local optim = require('anatomy.optim')
local fs = require('anatomy.io.fs')
local probe_record = require('anatomy.train.probe_record')
local hooks = require('anatomy.probe.hooks')
local scope = require('anatomy.probe.scope')
local parallel = require('anatomy.train.parallel')
local checkpoint = require('anatomy.train.checkpoint')
local evaluate = require('anatomy.train.evaluate')
local train_log = require('anatomy.train.log')
local Run = require('anatomy.train.Run')

local Trainer = {}
Trainer.__index = Trainer

local function format_time(seconds)
  seconds = math.max(0, math.floor(seconds + 0.5))
  if seconds >= 3600 then return ('%d:%02d:%02d'):format(seconds / 3600, seconds % 3600 / 60, seconds % 60) end
  return ('%d:%02d'):format(seconds / 60, seconds % 60)
end

-- Runs the model once more with every module's output checked; returns the
-- dotted name and class of the first module whose output is not finite.
function Trainer.find_nonfinite(model, x)
  local found
  scope.run(model, function()
    hooks.watch(model, function(name, y, m)
      if found == nil and torch.is_tensor(y) and y:is_floating_point() and not y:isfinite():all():item() then
        found = ('%s (%s)'):format(name, nn.typename(m))
      end
    end)
    torch.no_grad(function() model(x) end)
  end)
  return found
end

-- The first parameter (by name) whose gradient is not finite.
local function first_bad_grad(model)
  for name, p in model:named_parameters() do
    if p.grad ~= nil and not p.grad:isfinite():all():item() then return name end
  end
end

-- Trainer.new(model, corpus, o) -> a trainer over the settings o
-- (train/config.lua's, resolved): the data-parallel world joined, AdamW and
-- its schedule made, the run's record started.
function Trainer.new(model, corpus, o)
  local self = setmetatable({model = model, corpus = corpus, o = o}, Trainer)
  if o.seed then torch.manual_seed(o.seed) end
  model:train()
  self.params = model:parameters()
  self.world, self.rank, self.reducer = parallel.setup(self.params, o)
  self.main = self.rank == 0
  self.opt = optim.AdamW(self.params, {lr = o.lr, betas = o.betas, weight_decay = o.weight_decay, decay = o.decay})
  self.lr_at = optim.schedule(o.schedule, o.lr, o.steps, o.warmup)  -- replaced when resuming a run of another length
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
  config['config.world_size'] = self.world
  self.run = Run.new(config, self.world)
  -- what the probes capture by default: the output of every layer of the stack
  local layers = o.probe and not o.probe.filter and model:layers()
  if layers then
    self.probe_filter = {}
    for _, l in ipairs(layers) do self.probe_filter[#self.probe_filter + 1] = l[1] end
  end
  self.time_before = 0  -- seconds the resumed run had trained: the log's time goes on from there
  self.tokens, self.steps_done = 0, 0
  return self
end

-- trainer:resume(): stale files of a killed writer removed; the model, the
-- optimizer and the generator loaded from the checkpoint when it exists
-- (and o.resume), the schedule of the run that wrote it kept.
function Trainer:resume()
  local o, run = self.o, self.run
  -- what a writer killed mid-write left beside the checkpoint and the log
  if self.main and o.checkpoint then fs.remove_stale(o.checkpoint) end
  if self.main and o.log then fs.remove_stale(o.log) end
  local resuming = o.checkpoint and o.resume and fs.exists(o.checkpoint)
  parallel.check_resume(o, self.world, resuming)
  if not resuming then return end
  local step, meta = checkpoint.load(o.checkpoint, self.model, self.opt)
  parallel.check_world(o.checkpoint, meta, self.world)
  run.first_step = step + 1
  run.resumed_from = step
  self.time_before = tonumber(meta.time) or 0
  if not o.quiet then print(('resuming from %s at step %d'):format(o.checkpoint, step)) end
  -- A run resumed for more (or fewer) steps keeps the schedule it was
  -- trained on up to that run's end; past it, the learning rate stays at
  -- the schedule's last value rather than jumping back up.
  local old_steps = tonumber(meta['config.steps'])
  if old_steps and old_steps ~= o.steps then
    local old_lr_at = optim.schedule(meta['config.schedule'] or o.schedule, tonumber(meta['config.lr']) or o.lr,
      old_steps, tonumber(meta['config.warmup']) or o.warmup)
    self.lr_at = function(s) return old_lr_at(math.min(s, old_steps)) end
    if not o.quiet then
      print(('the checkpoint is of a %d-step run; resumed for %d steps: its %s schedule is kept to step %d, then lr stays at %.4g')
        :format(old_steps, o.steps, meta['config.schedule'] or o.schedule, old_steps, old_lr_at(old_steps)))
    end
    run.config['config.steps'] = old_steps  -- later checkpoints keep describing the schedule in use
    run.config['config.resumed_steps'] = o.steps
  end
end

-- trainer:prepare(): the forward pass and the loss (in autocast when dtype
-- asks for it; the loss in float32 from the logits either way), the log
-- opened, the clock started; on a GPU, the corpus's ids checked once.
function Trainer:prepare()
  local o, model, run = self.o, self.model, self.run
  self.log = o.log and self.main and train_log.open(o.log, run.resumed_from)
  self.tty = native.isatty(1) and not o.quiet
  self.started = native.now()
  run.started, run.started_utc = self.started, os.date('!%Y-%m-%dT%H:%M:%SZ')  -- this run's own (an autopsy of it records them)
  -- batches go where the model's parameters are, whatever the default device
  self.device = model:device()
  local device_type = self.device:match('^%a+')  -- 'cpu', 'cuda' or 'accel' (autocast's device type)
  local autocast = o.compute_dtype ~= 'float32' and o.compute_dtype or nil
  local function forward(x, hidden)
    if not autocast then return model(x, hidden) end
    return torch.autocast(device_type, autocast, function() return model(x, hidden) end)
  end
  local function loss_of(logits, y)
    if autocast then logits = logits:float() end
    return nn.functional.cross_entropy(logits, y)
  end
  self.forward, self.loss_of = forward, loss_of
  -- On a GPU the range checks of token ids and targets would read every batch
  -- back to the host. Every id of a batch is one of the corpus's, so the
  -- corpus's smallest and largest id go through the model once, checked; the
  -- run then trains with GPU ids trusted (host/runtime.h, TrustedIds).
  local gpu_paths = device_type ~= 'cpu' or o._gpu_paths  -- accel, the test device, takes them as cuda does
  if gpu_paths then
    local ids = self.corpus:tokens()
    local probe_ids = torch.full({1, o.seq}, ids:min():item(), {dtype = 'int64', device = self.device})  -- not the default device
    probe_ids:narrow(2, o.seq, 1):fill_(ids:max():item())
    local ok, err = pcall(scope.run, model, function()  -- the ids as inputs and as targets
      torch.no_grad(function() nn.functional.cross_entropy((model(probe_ids)), probe_ids) end)
    end, {mode = 'eval'})
    if not ok then
      error(('train.fit: the corpus\'s token ids (%d..%d) do not fit the model: %s'):format(
        ids:min():item(), ids:max():item(), tostring(err):gsub('^[^:]*:%d+: ', '')), 0)
    end
    self.forward = function(x, hidden) return native.blocks.with_trusted_ids(forward, x, hidden) end
    self.loss_of = function(logits, y) return native.blocks.with_trusted_ids(loss_of, logits, y) end
  end
  -- On a GPU the loss and gradient norm of a step are read back one step
  -- late, once the next step's work is queued, so the GPU never waits for the
  -- host (a step with an evaluation, a checkpoint or on_step is read at once).
  self.defer = gpu_paths and not o.on_step and not o.sync and self.world == 1
  if o.cuda_graph then self.opt:set_capturable(true) end
end

-- late: the loss was read after the optimizer took the step (a deferred read,
-- or a CUDA graph's step): the parameters now hold that step's non-finite
-- update, so a search for the first non-finite output would blame whichever
-- module reads them first. The message says so instead of naming one.
function Trainer:check_loss(value, step, x, late)
  if value ~= value or value == math.huge or value == -math.huge then
    if late then
      error(('train.fit: the loss is %s at step %d; it was read after the optimizer had taken that step (on %s the '
        .. 'loss is read one step late, so that the device never waits), so the module whose output first went '
        .. 'non-finite cannot be named from the parameters now: rerun with sync = true%s to find it'):format(
        tostring(value), step, self.device, self.o.cuda_graph and ' and without cuda_graph' or ''), 0)
    end
    local where = Trainer.find_nonfinite(self.model, x)
    error(('train.fit: the loss is %s at step %d; first non-finite value in the output of %s'):format(
      tostring(value), step, where or 'no module (the loss itself)'), 0)
  end
end

function Trainer:check_norm(norm, step)
  if norm ~= norm or norm == math.huge then
    error(('train.fit: the gradient of %s is not finite at step %d'):format(first_bad_grad(self.model) or '?', step), 0)
  end
end

-- cuda_graph: after two ordinary steps (warm-up), one step (forward,
-- backward, clipping, optimizer) is recorded once and replayed on fresh
-- batches copied into its input; probe steps run outside it.
function Trainer:graph_step(x, y)
  if not self.graph then
    local static = {x = x:clone(), y = y:clone(), graph = torch.cuda.CUDAGraph()}
    static.graph:capture_begin()
    local ok, err = pcall(function()
      self.opt:zero_grad()
      local loss = self.loss_of((self.forward(static.x)), static.y)
      loss:backward()
      static.norm = optim.clip_grad_norm_(self.params, self.o.clip)
      self.opt:step()
      static.loss = loss:detach()
    end)
    if not ok then
      static.graph:reset()
      error('train.fit: recording the training step in a CUDA graph failed: ' .. tostring(err), 0)
    end
    static.graph:capture_end()
    self.graph = static
  end
  local graph = self.graph
  graph.x:copy_(x)
  graph.y:copy_(y)
  graph.graph:replay()
  return graph.loss:clone(), graph.norm:clone()  -- the graph's own outputs are overwritten by the next replay
end

-- trainer:step(step) -> r: one step queued (forward, backward, clipping,
-- AdamW), with the probes riding along when it is a probe step; r holds
-- what report reads of it.
function Trainer:step(step)
  local o, world = self.o, self.world
  local lr = self.lr_at(step)
  self.opt:set_lr(lr)
  local x, y = self.corpus:batch(o.batch * world, o.seq, {device = self.device})
  x, y = parallel.rows(x, y, self.rank, o.batch, world)
  local r = {step = step, lr = lr, x = x}
  self.tokens = self.tokens + o.batch * world * o.seq * (1 + (o.recurrence or 0))
  -- probes ride along on this step's own forward and backward: no extra pass
  local capture, capture_handle
  if o.probe and (step % (o.probe.every or 50) == 0 or step == 1) then
    capture, capture_handle = hooks.attach_capture(self.model, {filter = o.probe.filter or self.probe_filter, grad = o.probe.grad})
  end
  if o.cuda_graph and not capture_handle and step >= self.run.first_step + 2 then
    r.loss, r.norm = self:graph_step(x, y)
    return r
  end
  self.opt:zero_grad()
  -- One ordinary pass; with recurrence = k (a stateful model), k more passes
  -- that take the previous pass's last hidden states, each with its own
  -- loss and backward. The step's loss is the deepest pass's.
  local hidden
  for depth = 0, o.recurrence or 0 do
    local logits, h = self.forward(x, hidden)
    local loss = self.loss_of(logits, y)
    if not self.defer or o.recurrence then
      r.value = loss:item()
      self:check_loss(r.value, step, x)
    end
    if self.reducer and depth == (o.recurrence or 0) then self.reducer:prepare() end  -- the last pass's backward
    loss:backward()
    r.loss = loss:detach()
    if o.recurrence then
      r.depth_losses = r.depth_losses or {}
      r.depth_losses[depth + 1] = r.value
      hidden = h:detach()
    end
  end
  if self.reducer then
    self.reducer:finish()  -- the gradients are now the average over the ranks
    parallel.average_loss(r)
  end
  if capture_handle then
    capture_handle:remove()
    -- the autopsy's own per-step measures: fused gradient norms, stds read back together
    local record = probe_record.probe_record(self.model, step, capture, world > 1)
    if o.probe.fn then o.probe.fn(step, capture, record) end
    self.run.probes[#self.run.probes + 1] = record
  end
  r.norm = optim.clip_grad_norm_(self.params, o.clip)
  if not self.defer then
    r.norm_value = r.norm:item()
    self:check_norm(r.norm_value, step)
  end
  self.opt:step()
  return r
end

-- trainer:report(r): reads a queued step's loss and norm, and reports it:
-- the run's record, evaluation, the log, the progress line, the
-- checkpoint, on_step.
function Trainer:report(r)
  local o, run, step = self.o, self.run, r.step
  if not r.value then
    r.value = r.loss:item()
    self:check_loss(r.value, step, r.x, true)
  end
  if not r.norm_value then
    r.norm_value = r.norm:item()
    self:check_norm(r.norm_value, step)
  end
  local value, lr, norm = r.value, r.lr, r.norm_value
  if r.depth_losses then run.depth_losses[#run.depth_losses + 1] = r.depth_losses end
  self.steps_done = self.steps_done + 1
  run.train[#run.train + 1] = value
  run.steps = step
  local info = {step = step, loss = value, lr = lr, grad_norm = norm}
  if step % o.eval_every == 0 or step == o.steps then
    info.val_loss = evaluate(self.model, self.corpus, {seq = o.seq, batches = o.eval_batches, batch = o.batch,
      _world = self.world > 1 and self.world or nil}).nats
    run.val[#run.val + 1] = {step = step, loss = info.val_loss}
  end
  local elapsed = native.now() - self.started
  info.tokens_per_second = self.tokens / math.max(elapsed, 1e-9)
  if self.log then
    self.log:write(('{"step": %d, "loss": %.9g, "lr": %.6g, "grad_norm": %.6g%s, "tokens_per_second": %.1f, "time": %.3f}\n')
      :format(step, value, lr, norm, info.val_loss and (', "val_loss": %.9g'):format(info.val_loss) or '',
        info.tokens_per_second, self.time_before + elapsed))
    self.log:flush()
  end
  if not o.quiet then self:progress(step, value, info, elapsed) end
  if self.main and o.checkpoint and ((o.checkpoint_every and step % o.checkpoint_every == 0) or step == o.steps) then
    self:save(step, elapsed)
  end
  if o.on_step then o.on_step(step, info) end
end

-- The progress line: rewritten in place on a terminal, every log_every
-- steps (and at each evaluation) elsewhere.
function Trainer:progress(step, value, info, elapsed)
  local o = self.o
  local eta = elapsed / self.steps_done * (o.steps - step)
  local last_val = self.run.val[#self.run.val]
  local line = ('step %d/%d | loss %.4f%s | %.0f tok/s | ETA %s'):format(step, o.steps, value,
    last_val and (' | val %.4f'):format(last_val.loss) or '', info.tokens_per_second, format_time(eta))
  if self.tty then
    io.write('\r\27[K' .. line)
    if step == o.steps then io.write('\n') end
    io.flush()
  elseif step % o.log_every == 0 or step == o.steps or info.val_loss then
    print(line)
  end
end

-- trainer:save(step, elapsed): the checkpoint, after the log it names is on disk.
function Trainer:save(step, elapsed)
  local meta = {time = ('%.3f'):format(self.time_before + elapsed)}
  for k, v in pairs(self.run.config) do meta[k] = v end
  -- the log first: once the checkpoint names a step, the log holds it
  if self.log then fs.sync(self.o.log) end
  checkpoint.save(self.o.checkpoint, self.model, self.opt, step, meta)
  self.saved_step = step
  -- kept by step: a second name for the file just written, which the next
  -- checkpoint's rename over the first name leaves as it is
  if self.o.keep_checkpoints then native.hardlink(self.o.checkpoint, checkpoint.at_step(self.o.checkpoint, step)) end
end

-- a step whose report needs the model as it is right after it
function Trainer:due(step)
  local o = self.o
  return step == o.steps or step % o.eval_every == 0 or (o.checkpoint and o.checkpoint_every and step % o.checkpoint_every == 0)
end

-- trainer:loop(): every step from the first (after a resume) to o.steps, or
-- to the time budget, or to Ctrl-C at a step boundary; a deferred step is
-- reported once the next one is queued.
function Trainer:loop()
  local o, run = self.o, self.run
  local pending
  -- one process: Ctrl-C is held while a step runs and taken between steps,
  -- so the model, the optimizer and the generator are those of a whole step
  -- and the checkpoint written then resumes exactly (a second Ctrl-C still
  -- ends the process). Several processes stop together or not at all: there
  -- it interrupts where it lands, and the run ends with an error.
  local hold = self.world == 1
  local stopped
  for step = run.first_step, o.steps do
    if hold then native.hold_interrupts(true) end
    local ok, err = pcall(function()
      local r = self:step(step)
      if pending then
        local p = pending
        pending = nil
        self:report(p)
      end
      if self.defer and not self:due(step) then pending = r else self:report(r) end
    end)
    local came = hold and native.hold_interrupts(false)
    if not ok then
      if tostring(err):match('interrupted$') and self.world == 1 then
        if pending then pcall(self.report, self, pending) end
        run.interrupted = true
        if self.tty then io.write('\n') end
        print(('interrupted at step %d: the model keeps what it learned in %d steps'):format(step, step - 1))
        pending = nil  -- stopped inside a step (an interrupt that came before it): no checkpoint of a half step
        break
      end
      if self.log then self.log:close() end
      error(err, 0)
    end
    if came then
      run.interrupted = true
      stopped = 'interrupted'
      if self.tty then io.write('\n') end
      print(('interrupted after step %d: the model keeps what it learned in %d steps'):format(step, step))
      break
    end
    if o.seconds and step < o.steps and native.now() - self.started >= o.seconds then
      stopped = 'seconds'
      break
    end
  end
  if pending then
    local ok, err = pcall(self.report, self, pending)
    if not ok then
      if self.log then self.log:close() end
      error(err, 0)
    end
  end
  -- a run that stops early keeps what it did: its checkpoint at the last
  -- step it finished, so that resume = true goes on from there
  if stopped and self.main and o.checkpoint and run.steps and run.steps >= run.first_step and self.saved_step ~= run.steps then
    self:save(run.steps, native.now() - self.started)
    if not o.quiet then print(('checkpoint at step %d: %s (resume = true goes on from it)'):format(run.steps, o.checkpoint)) end
  end
end

-- trainer:close() -> the run, with its times, speed and optimizer
function Trainer:close()
  local run = self.run
  if self.o.cuda_graph then self.opt:set_capturable(false) end
  if self.log then self.log:close() end
  run.seconds = native.now() - self.started
  run.total_seconds = self.time_before + run.seconds  -- with the time of the run it resumed
  run.tokens_per_second = self.tokens / math.max(run.seconds, 1e-9)
  run.optimizer = self.opt
  parallel.finish(run, self.reducer)
  return run
end

return Trainer
