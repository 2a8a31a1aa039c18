-- When did a layer become a passenger? The autopsy at every checkpoint of a
-- training run, with the verdict changes and a report that charts each
-- measure over the steps.
--   anatomy examples/series_autopsy.lua [--data=FILE] [--steps=2000] [--every=250]
--       trains a small GPT here, keeping a checkpoint every `every` steps
--       (train.fit's keep_checkpoints), then dissects each one
--   anatomy examples/series_autopsy.lua --hub=EleutherAI/pythia-70m --revisions=step1000,step8000,step64000,step143000
--       the same over a published run's Hub revisions (fetched one at a time
--       into huggingface_hub's cache)
--   anatomy examples/series_autopsy.lua --smoke=true   (a few steps, to test the script)
-- Every key below can be overridden with --key=value; --help lists them.
local fs = require('anatomy.io.fs')
local cfg = experiment.config({
  data = '',               -- a text file; empty: the King James Bible (Debian's bible-kjv)
  steps = 2000, every = 250, -- the run, and how often it keeps a checkpoint
  dim = 128, layers = 6, heads = 4, seq = 128, batch = 32, lr = 1e-3,
  hub = '',                -- a Hub repository id: dissect its revisions instead of training
  revisions = '',          -- with hub: a comma-separated list (hub.list_repo_refs lists them)
  batches = 2,             -- batches each autopsy averages over (the same at every checkpoint)
  seed = 1337,
  out = 'out/series_autopsy',
}, {steps = 6, every = 2, dim = 32, layers = 2, seq = 32, batch = 4, batches = 1},  -- --smoke=true: a few steps
  arg, 'usage: anatomy examples/series_autopsy.lua [--hub=ORG/NAME --revisions=a,b,c] [--key=value ...]')

local s
if cfg.hub ~= '' then
  local revisions = {}
  for r in cfg.revisions:gmatch('[^,%s]+') do revisions[#revisions + 1] = r end
  if #revisions < 2 then error('examples/series_autopsy.lua: --hub needs --revisions=a,b,... (two or more)', 0) end
  local tok = data.tokenizer(cfg.hub, {revision = revisions[#revisions]})
  local corpus = data.text(cfg.data ~= '' and cfg.data or data.default_text(), {tokenizer = tok})
  print(corpus)
  s = autopsy.series(cfg.hub, {revisions = revisions, seed = cfg.seed}, corpus,
    {steps = cfg.batches, batch = cfg.batch, seq = cfg.seq, config = cfg})
else
  local corpus = data.text(cfg.data ~= '' and cfg.data or data.default_text())
  print(corpus)
  local function fresh()
    torch.manual_seed(cfg.seed)
    return models.gpt{vocab = corpus.vocab_size, dim = cfg.dim, layers = cfg.layers, heads = cfg.heads, seq = cfg.seq,
      ffn = 4 * cfg.dim}
  end
  local dir = cfg.out .. '/checkpoints'
  fs.mkdir(dir)
  for _, name in ipairs(fs.list(dir)) do os.remove(dir .. '/' .. name) end  -- this run's checkpoints only
  train.fit(fresh(), corpus, {steps = cfg.steps, batch = cfg.batch, seq = cfg.seq, lr = cfg.lr, seed = cfg.seed,
    checkpoint = dir .. '/run.safetensors', checkpoint_every = cfg.every, keep_checkpoints = true, resume = false})
  s = autopsy.series(dir, {model = fresh(), seed = cfg.seed}, corpus,
    {steps = cfg.batches, batch = cfg.batch, seq = cfg.seq, config = cfg})
end
print()
print(s)
print(('\nreport: %s\ndata:   %s'):format(s:report(cfg.out .. '/series.html'), s:json(cfg.out .. '/series.json')))
