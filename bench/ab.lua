-- One side of an A/B timing (scripts/ab runs two builds of anatomy on it in
-- turns): the training step and the autopsy, on models of the seed
-- architectures, with the numbers each run's median makes. Written for the
-- library of any commit since the autopsy took `history` (bench/timing.lua
-- reads the clock where each keeps it).
--   anatomy --threads=N bench/ab.lua --steps=N --warmup=N --out=FILE
local cfg = torch.config.parse({
  steps = 15,     -- timed repetitions per case (the median is reported)
  warmup = 3,     -- untimed first
  autopsies = 5,  -- timed autopsy.run calls
  out = '',       -- JSON output (default: stdout)
  only = '',      -- run only the cases whose name contains this
}, arg, 'usage: anatomy bench/ab.lua [--steps=N] [--warmup=N] [--autopsies=N] [--out=FILE]')

package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local timing = require('timing')

-- the median of n timed calls of fn() after warmup untimed ones
local function timed(n, warmup, fn) return timing.steps(n, warmup, fn).median end

local function want(name) return cfg.only == '' or name:find(cfg.only, 1, true) end
local results = {}

-- one AdamW step (zero_grad, forward, loss, backward, step) on random tokens
local steps = {
  {'train_step_gpt', function() return models.gpt{vocab = 65, dim = 128, heads = 4, layers = 2, seq = 128, ffn = 512} end, 65, 16, 128},
  {'train_step_vibenet', function() return models.vibenet{vocab = 256, dim = 128, layers = 4, seq = 128, block = 'plain'} end, 256, 16, 128},
  {'train_step_llama', function() return models.llama{vocab = 256, dim = 128, heads = 4, kv_heads = 2, layers = 2, ffn = 384, seq = 128} end, 256, 16, 128},
}
for _, c in ipairs(steps) do
  local name, make, V, B, T = c[1], c[2], c[3], c[4], c[5]
  if want(name) then
    torch.manual_seed(1)
    local model = make()
    local x, y = torch.randint(1, V + 1, {B, T}), torch.randint(1, V + 1, {B, T})
    local opt = optim.AdamW(model, {lr = 1e-3, weight_decay = 0.01})
    results[name] = timed(cfg.steps, cfg.warmup, function()
      opt:zero_grad()
      nn.functional.cross_entropy(model(x), y):backward()
      opt:step()
    end)
  end
end

-- train.fit's own step (the Trainer, its probes every 5 steps), per step
local text = ('First Citizen:\nBefore we proceed any further, hear me speak.\nAll:\nSpeak, speak.\n'):rep(400)
local corpus = data.from_string(text, {tokenizer = 'char'})
if want('fit') then
  local fit_steps = 4 * cfg.steps
  results.fit_step = timed(1, 0, function()
    torch.manual_seed(1)
    local model = models.gpt{vocab = corpus.vocab_size, dim = 64, heads = 2, layers = 2, seq = 64, ffn = 256}
    train.fit(model, corpus, {steps = fit_steps, batch = 16, seq = 64, lr = 3e-3, probe = {every = 5}, quiet = true})
  end) / fit_steps
end

-- autopsy.run over 4 validation batches of 16, every measurement of the default run
if want('autopsy') then
  torch.manual_seed(1)
  local model = models.gpt{vocab = corpus.vocab_size, dim = 64, heads = 2, layers = 4, seq = 64, ffn = 256}
  results.autopsy_run = timed(cfg.autopsies, 1, function()
    local a = autopsy.run(model, corpus, {steps = 4, batch = 16, seq = 64})
    assert(#a.rows >= 4)
  end)
end

local parts = {}
for name, v in pairs(results) do parts[#parts + 1] = ('"%s": %.6f'):format(name, v) end
table.sort(parts)
timing.write(cfg.out, '{' .. table.concat(parts, ', ') .. '}')
