-- The anatomy half of the GPU benchmark (scripts/bench-gpu runs it next to
-- bench/gpu.py, which runs the same cases in PyTorch, and reports both).
-- One training step (zero_grad, forward, cross-entropy, backward, AdamW) on a
-- fixed batch already on the device, timed over windows of steps between two
-- synchronisations; eager, and (on a GPU) the same step recorded once in a
-- CUDA graph and replayed. Writes one JSON object to --out, again after each
-- case (a run cut short keeps what finished).
--   anatomy --device=cuda bench/gpu.lua --out=FILE [--steps=N] [--only=NAME] [--smoke=true]
-- --smoke=true: every case at toy sizes, on whatever device there is: it checks
-- that the script runs, and its numbers mean nothing (the report says so).
local native = require('anatomy.torch.native')
local cfg = torch.config.parse({
  steps = 30,        -- timed steps per window
  windows = 5,       -- windows per case (the median window is reported)
  warmup = 5,        -- untimed steps first (and before a capture)
  vocab = 16384,     -- the seed-scale models' vocabulary (scripts/bench-gpu passes the SentencePiece model's)
  out = '',          -- JSON output file (default: stdout)
  only = '',         -- run only the cases whose name contains this
  smoke = false,     -- toy sizes: a check that the script runs, not a measurement
}, arg, 'usage: anatomy --device=cuda bench/gpu.lua [--steps=N] [--windows=N] [--vocab=N] [--only=NAME] [--smoke=true] [--out=FILE]')

local now = native.now
local device = torch.device()
local cuda = device:match('^cuda') ~= nil
local function sync() if cuda then torch.cuda.synchronize() end end
if cfg.smoke then cfg.steps, cfg.windows, cfg.warmup = 2, 2, 1 end

local results = {side = 'anatomy', device = device, libtorch = torch.libtorch_version, cuda = torch.version.cuda,
  smoke = cfg.smoke, steps = cfg.steps, windows = cfg.windows, cases = {}}

local function median(t)
  local s = {unpack(t)}
  table.sort(s)
  local n = #s
  return n % 2 == 1 and s[(n + 1) / 2] or (s[n / 2] + s[n / 2 + 1]) / 2
end

-- seconds per call of fn: the median over cfg.windows windows of cfg.steps
-- calls, each window between two synchronisations (GPU work is asynchronous)
local function per_step(fn)
  for _ = 1, cfg.warmup do fn() end
  sync()
  local times = {}
  for w = 1, cfg.windows do
    local t0 = now()
    for _ = 1, cfg.steps do fn() end
    sync()
    times[w] = (now() - t0) / cfg.steps
  end
  return {median = median(times), min = math.min(unpack(times)), max = math.max(unpack(times)), times = times}
end

-- The host's share of a step: the median time to queue one step after a
-- synchronisation (the device idle), and of the step to its end. When the
-- first is close to the second the step is bound by the host's work (Lua,
-- the dispatcher, kernel launches), not by the device's.
local function enqueue_time(fn)
  local queued, whole = {}, {}
  for i = 1, math.max(3, cfg.windows) do
    sync()
    local t0 = now()
    fn()
    queued[i] = now() - t0
    sync()
    whole[i] = now() - t0
  end
  return {queued = median(queued), whole = median(whole)}
end

-- one AdamW step on (x, y); dtype 'bfloat16' runs the forward under autocast
-- (the loss in float32), as train.fit does with dtype = 'bfloat16'. The batch's
-- ids are checked once here; the step trusts them, as train.fit's does (a
-- range check of ids on the device would read them back to the host).
local kind = device:match('^%a+')  -- autocast's device type
local function trainer(model, x, y, dtype)
  local opt = optim.AdamW(model, {lr = 1e-3, weight_decay = 0.01})
  local V = model.config.vocab
  assert(x:min():item() >= 1 and x:max():item() <= V and y:min():item() >= 1 and y:max():item() <= V, 'the batch fits the vocabulary')
  local function forward() return model(x) end
  local function step()
    opt:zero_grad()
    local logits = dtype and torch.autocast(kind, dtype, forward) or forward()
    local loss = nn.functional.cross_entropy(dtype and logits:float() or logits, y)
    loss:backward()
    opt:step()
  end
  return function() native.blocks.with_trusted_ids(step) end, opt
end

-- the same step recorded once in a CUDA graph (the optimizer capturable, as
-- train.fit{cuda_graph = true} does) and replayed; called on a side stream
-- (torch.cuda.side_stream), where the warm-up steps run too
local function graphed(model, x, y, dtype)
  local step, opt = trainer(model, x, y, dtype)
  opt:set_capturable(true)
  for _ = 1, cfg.warmup do step() end
  sync()
  local g = torch.cuda.CUDAGraph()
  g:capture_begin()
  local ok, err = pcall(step)
  if not ok then g:reset(); error('recording the step in a CUDA graph failed: ' .. tostring(err), 0) end
  g:capture_end()
  return function() g:replay() end
end

local function want(name) return cfg.only == '' or name:find(cfg.only, 1, true) end

-- name, model, vocab, batch, seq, dtype; the small cases are bench/bench.lua's
local S = cfg.smoke
local seed_vocab = S and 512 or cfg.vocab
-- VibeNet at the seed's scale: dim 512 (expansion 1536, untied head), B16 T512, bf16
local function seed(layers)
  return {'seed_L' .. layers, function() return models.vibenet{vocab = seed_vocab, dim = S and 64 or 512, layers = layers, seq = S and 32 or 512, block = 'ffn'} end,
    seed_vocab, S and 2 or 16, S and 32 or 512, 'bfloat16'}
end
local cases = {
  {'gpt', function() return models.gpt{vocab = 65, dim = 64, heads = 2, layers = 1, seq = 64, ffn = 128} end, 65, S and 2 or 32, S and 16 or 64},
  {'vibenet_plain', function() return models.vibenet{vocab = 256, dim = 128, layers = 4, seq = 128, block = 'plain'} end, 256, S and 2 or 16, S and 16 or 128},
  {'vibenet_gate', function() return models.vibenet{vocab = 256, dim = 128, layers = 4, seq = 128, block = 'gate'} end, 256, S and 2 or 16, S and 16 or 128},
  seed(2),
  seed(12),
}

local function batch(V, B, T)
  torch.manual_seed(0)
  return torch.randint(1, V + 1, {B, T}), torch.randint(1, V + 1, {B, T})
end

-- Peak memory on a GPU: a counter that cannot be read leaves the figure
-- empty and says why, rather than stopping the run.
local peak_error
local function peak_reset()
  if not cuda then return end
  torch.cuda.synchronize()
  local ok, err = pcall(torch.cuda.reset_peak_memory_stats)
  peak_error = not ok and tostring(err) or nil
end
local function peak()
  if not cuda or peak_error then return nil end
  local ok, v = pcall(torch.cuda.max_memory_allocated)
  if not ok then peak_error = tostring(v) return nil end
  return v
end

-- the results so far, written atomically (after each case and at the end)
local function save()
  local text = require('anatomy.io.json').encode(results)
  if cfg.out ~= '' then require('anatomy.io.fs').write_atomic(cfg.out, text .. '\n') end
  return text
end

local kept = {}
for _, c in ipairs(cases) do
  local name, make, V, B, T, dtype = unpack(c)
  if want(name) then
    for _, mode in ipairs{'eager', 'graph'} do
      if mode == 'eager' or cuda then
        collectgarbage()
        peak_reset()
        torch.manual_seed(1)
        local model = make()
        local x, y = batch(V, B, T)
        local s, eager_step
        if mode == 'eager' then
          eager_step = trainer(model, x, y, dtype)
          s = per_step(eager_step)
          s.count = torch.profiler.count_ops(eager_step)  -- one more step: its operators and host syncs
          s.enqueue = enqueue_time(eager_step)
        else
          local ok, err = pcall(torch.cuda.side_stream, function() s = per_step(graphed(model, x, y, dtype)) end)
          if not ok then s = {error = tostring(err)} end  -- the eager figure stands; the graph's says why it is missing
        end
        s.peak_bytes = peak()
        s.peak_error = peak_error
        s.tokens = B * T
        s.params = model:num_parameters()
        s.dtype = dtype or 'float32'
        s.config = {vocab = V, batch = B, seq = T, dim = model.config.dim, layers = model.config.layers,
          block = model.config.block, heads = model.config.heads, ffn = model.config.ffn}
        results.cases[name .. '.' .. mode] = s
        save()
        if mode == 'eager' then kept[name] = {model = model, x = x, y = y, step = eager_step, dtype = dtype} end
      end
    end
  end
end

-- times fa() and fb() in alternating windows, so that a slow spell falls on both
local function per_step_pair(fa, fb)
  for _ = 1, cfg.warmup do fa(); fb() end
  sync()
  local a, b = {}, {}
  for w = 1, cfg.windows do
    for k = 0, 1 do
      local f = (w + k) % 2 == 1 and fa or fb
      local t0 = now()
      for _ = 1, cfg.steps do f() end
      sync()
      local list = f == fa and a or b
      list[#list + 1] = (now() - t0) / cfg.steps
    end
  end
  return {median = median(a), times = a}, {median = median(b), times = b}
end

-- the autopsy's measurements taken from a training step's own forward and
-- backward, against the plain step (the seed-scale L2 model, else VibeNet plain)
local base = kept.seed_L2 or kept.vibenet_plain
local base_name = kept.seed_L2 and 'seed_L2' or 'vibenet_plain'
-- the autopsy and idle probes ride on the case they are measured against
local function want_extra(name) return want(name) or (cfg.only ~= '' and base_name:find(cfg.only, 1, true) ~= nil) end
if want_extra('autopsy') and base then
  local opt = optim.AdamW(base.model, {lr = 1e-3, weight_decay = 0.01})
  local function autopsy_step()
    opt:zero_grad()
    native.blocks.with_trusted_ids(autopsy.step, base.model, function()  -- the batch's ids were checked once, as the plain step's
      local logits = base.dtype and torch.autocast(kind, base.dtype, function() return base.model(base.x) end) or base.model(base.x)
      local loss = nn.functional.cross_entropy(base.dtype and logits:float() or logits, base.y)
      loss:backward()
      return loss
    end)
    opt:step()
  end
  local measured, plain = per_step_pair(autopsy_step, base.step)
  results.cases.autopsy = {median = measured.median, times = measured.times, plain = plain, of = base_name,
    count = torch.profiler.count_ops(autopsy_step)}
  save()
end

-- a probe that does nothing on every module, against the same model without
if want_extra('idle') and base then
  local probed
  for _, c in ipairs(cases) do if c[1] == base_name then torch.manual_seed(1); probed = c[2]() end end
  local n = 0
  for name in probed:named_modules() do
    if name ~= '' then probe.idle(probed, name); n = n + 1 end
  end
  local with, plain = per_step_pair(trainer(probed, base.x, base.y, base.dtype), base.step)
  results.cases.idle_probes = {median = with.median, times = with.times, plain = plain, probes = n, of = base_name}
end

local text = save()
if cfg.out == '' then print(text) end
