-- The anatomy half of the side-by-side benchmark (scripts/bench runs it next
-- to bench/peer.py and prints both). Writes one JSON object to --out.
--   anatomy --threads=N bench/bench.lua --steps=20 --warmup=5 --out=FILE
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local timing = require('timing')
local cfg = torch.config.parse({
  steps = 20,        -- timed steps per case (the median is reported)
  warmup = 5,        -- untimed steps first
  ops = 200000,      -- 1-element adds for the per-op cost
  out = '',          -- JSON output file (default: stdout)
  only = '',         -- run only the cases whose name contains this
}, arg, 'usage: anatomy bench/bench.lua [--steps=N] [--warmup=N] [--out=FILE]')

local now = timing.now
local results = {threads = torch.get_num_threads(), libtorch = torch.libtorch_version, cases = {},
  blas = torch.__config__.show():match('BLAS_INFO=(%w+)') or '?', cpu_capability = torch.backends.cpu.get_cpu_capability()}

-- cfg.steps timed calls of fn() after cfg.warmup: their median, range and the times themselves (scripts/bench merges rounds)
local function time_steps(fn) return timing.steps(cfg.steps, cfg.warmup, fn) end

-- times fa() and fb() alternately (fa first on odd steps, fb first on even
-- ones), so that a slow spell of the machine falls on both
local function time_pair(fa, fb)
  for _ = 1, cfg.warmup do fa(); fb() end
  local ta, tb = {}, {}
  for i = 1, cfg.steps do
    for k = 0, 1 do
      local first = (i + k) % 2 == 1
      local t0 = now()
      if first then fa() else fb() end
      local dt = now() - t0
      if first then ta[#ta + 1] = dt else tb[#tb + 1] = dt end
    end
  end
  return timing.summary(ta), timing.summary(tb)
end

local function batch(V, B, T)
  torch.manual_seed(0)
  return torch.randint(1, V + 1, {B, T}), torch.randint(1, V + 1, {B, T})
end

-- one AdamW training step: zero_grad, forward, loss, backward, step
local function trainer(model, x, y)
  local opt = optim.AdamW(model, {lr = 1e-3, weight_decay = 0.01})
  local F = nn.functional
  return function()
    opt:zero_grad()
    local loss = F.cross_entropy(model(x), y)
    loss:backward()
    opt:step()
  end
end

local function want(name) return cfg.only == '' or name:find(cfg.only, 1, true) end

local cases = {
  {'gpt', function() return models.gpt{vocab = 65, dim = 64, heads = 2, layers = 1, seq = 64, ffn = 128} end, 65, 32, 64},
  {'vibenet_plain', function() return models.vibenet{vocab = 256, dim = 128, layers = 4, seq = 128, block = 'plain'} end, 256, 16, 128},
  {'vibenet_ffn', function() return models.vibenet{vocab = 256, dim = 128, layers = 4, seq = 128, block = 'ffn'} end, 256, 16, 128},
  {'vibenet_gate', function() return models.vibenet{vocab = 256, dim = 128, layers = 4, seq = 128, block = 'gate'} end, 256, 16, 128},
}
local steps_by_name = {}
for _, c in ipairs(cases) do
  local name, make, V, B, T = c[1], c[2], c[3], c[4], c[5]
  if want(name) then
    torch.manual_seed(1)
    local model = make()
    local x, y = batch(V, B, T)
    local step = trainer(model, x, y)
    local s = time_steps(step)
    s.tokens = B * T
    s.params = model:num_parameters()
    results.cases[name] = s
    steps_by_name[name] = {model = model, x = x, y = y, step = step, time = s.median}
  end
end

-- the autopsy's measurements taken from a training step's own forward and
-- backward, as a fraction of a plain step (VibeNet plain)
if want('autopsy') and steps_by_name.vibenet_plain then
  local c = steps_by_name.vibenet_plain
  local opt = optim.AdamW(c.model, {lr = 1e-3, weight_decay = 0.01})
  local s, plain = time_pair(function()
    opt:zero_grad()
    local snap = autopsy.step(c.model, function()
      local loss = nn.functional.cross_entropy(c.model(c.x), c.y)
      loss:backward()
      return loss
    end)
    opt:step()
    assert(#snap.layers == 4 and snap.grad_norm['head.weight'] and snap.weight_erank['head.weight'])
  end, c.step)
  s.plain = plain
  results.cases.autopsy = s
end

-- every module of the model carries a probe that does nothing this step;
-- the same model without them alternates with it
if want('idle') and steps_by_name.vibenet_plain then
  torch.manual_seed(1)
  local c = steps_by_name.vibenet_plain
  local probed = models.vibenet{vocab = 256, dim = 128, layers = 4, seq = 128, block = 'plain'}
  local n = 0
  for name in probed:named_modules() do
    if name ~= '' then
      probe.idle(probed, name)
      n = n + 1
    end
  end
  local s, plain = time_pair(trainer(probed, c.x, c.y), c.step)
  s.plain = plain
  s.probes = n
  results.cases.idle_probes = s
end

-- a 1-element tensor add issued from Lua, per op: two (1)-shaped tensors
-- (computed without the dispatcher, host/small_arith.h), and a (1) and
-- a 0-dim tensor, which broadcast and so go through at::add
if want('add') then
  local function per_op(a, b)
    local n = cfg.ops
    local best = math.huge
    for _ = 1, 5 do
      local t0 = now()
      for _ = 1, n do local _ = a + b end
      best = math.min(best, (now() - t0) / n)
    end
    return {median = best, n = n}
  end
  results.cases.add = per_op(torch.tensor{1}, torch.tensor{2})
  results.cases.add_aten = per_op(torch.tensor{1}, torch.tensor(2))
end

-- BLAS throughput: a 1024³ float32 matmul
if want('blas') then
  local m = 1024
  local a, b = torch.randn(m, m), torch.randn(m, m)
  local s = time_steps(function() local _ = a:matmul(b) end)
  s.flops = 2 * m * m * m
  results.cases.blas = s
end

timing.write(cfg.out, require('anatomy.io.json').encode(results))
