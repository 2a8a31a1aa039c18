-- The main job: train a model for a short run with probes riding along on the
-- training steps, print its autopsy (the per-layer table and verdicts), and
-- write the JSON and the HTML report.
--   anatomy scripts/autopsy.lua --model=vibenet --steps=1000
--   anatomy --nproc 2 scripts/autopsy.lua   (data-parallel: --batch is each rank's)
-- Every key below can be overridden with --key=value; --help lists them.
local cfg = torch.config.parse({
  model = 'vibenet',       -- vibenet | gpt | funnel | stateful
  block = 'plain',         -- vibenet's block: plain | ffn | gate | hyper
  data = '',               -- a text file; empty: the King James Bible (Debian's bible-kjv)
  tokenizer = 'char',      -- char | byte | sentencepiece
  vocab_size = 2000,       -- sentencepiece's vocabulary
  dim = 64, heads = 2, layers = 4, ffn = 128, seq = 64,
  steps = 1000, batch = 32, lr = 3e-3, warmup = 50,
  probe_every = 50,        -- probes capture during every Nth training step
  batches = 4,             -- validation batches the autopsy averages over
  probe_text = 'In the beginning God created the heaven and the earth.',  -- the report's attention maps
  seed = 1337,
  out = 'out',             -- where autopsy.json and autopsy.html go
}, arg, 'usage: anatomy scripts/autopsy.lua [--key=value ...]')

-- in a data-parallel run, rank 0 alone prints and writes
local main = dist.is_main()
local print = main and print or function() end

torch.manual_seed(cfg.seed)
local path = cfg.data ~= '' and cfg.data or data.default_text()
local corpus = data.text(path, {tokenizer = cfg.tokenizer, vocab_size = cfg.vocab_size})
print(corpus)

local V = corpus.vocab_size
local model = models.build(cfg.model, setmetatable({vocab = V}, {__index = cfg}))
print(('%s: %s parameters'):format(nn.typename(model), nn.format_count(model:num_parameters())))

local run = train.fit(model, corpus, {steps = cfg.steps, batch = cfg.batch, seq = cfg.seq, lr = cfg.lr,
  warmup = cfg.warmup, probe = {every = cfg.probe_every}})
print(run)

local a = autopsy.run(model, corpus, {steps = cfg.batches, batch = cfg.batch, history = run, probe_text = cfg.probe_text,
  config = cfg})
print()
print(a)
print()
if not main then return end
a:plot('grad_norm')
local json_path = a:json(cfg.out .. '/autopsy.json')
local html_path = a:report(cfg.out .. '/autopsy.html')
print(('\nreport: %s\ndata:   %s'):format(html_path, json_path))
print('\nprovenance: ' .. provenance.line(a.provenance))
