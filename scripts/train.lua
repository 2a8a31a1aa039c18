-- Train a model on a text, evaluate it, save a checkpoint and print a sample.
--   anatomy scripts/train.lua --model=gpt --data=FILE --steps=2000
-- Every key below can be overridden with --key=value; --help lists them.
local cfg = torch.config.parse({
  model = 'gpt',           -- gpt | vibenet | funnel | stateful
  block = 'plain',         -- vibenet's block: plain | ffn | gate | hyper
  norm = 'post',           -- gpt: post | pre
  residual = true,         -- gpt: false drops the residual adds
  data = '',               -- a text file; empty: the King James Bible (Debian's bible-kjv)
  tokenizer = 'char',      -- char | byte
  dim = 64, heads = 2, layers = 1, ffn = 128, seq = 64,
  steps = 2000, batch = 32, lr = 3e-3, warmup = 100, weight_decay = 0.1, clip = 1.0,
  schedule = 'cosine',     -- cosine | constant
  eval_every = 200, eval_batches = 8,
  seed = 1337,
  out = 'out/train',       -- folder for the checkpoint and the metrics log
  resume = false,          -- continue from out/checkpoint.safetensors if it exists
  sample = 300,            -- characters (tokens) to sample at the end; 0 for none
  temperature = 0.8, top_k = 0,
}, arg, 'usage: anatomy scripts/train.lua [--key=value ...]')

torch.manual_seed(cfg.seed)
local path = cfg.data ~= '' and cfg.data or data.default_text()
local corpus = data.text(path, {tokenizer = cfg.tokenizer})
print(corpus)

local V = corpus.vocab_size
local model = models.build(cfg.model, setmetatable({vocab = V}, {__index = cfg}))
print(('%s: %s parameters'):format(nn.typename(model), nn.format_count(model:num_parameters())))

require('anatomy.io.fs').mkdir(cfg.out)
local checkpoint = cfg.out .. '/checkpoint.safetensors'
if not cfg.resume then os.remove(checkpoint) end
local run = train.fit(model, corpus, {
  steps = cfg.steps, batch = cfg.batch, seq = cfg.seq, lr = cfg.lr, warmup = cfg.warmup,
  weight_decay = cfg.weight_decay, clip = cfg.clip, schedule = cfg.schedule, eval_every = cfg.eval_every,
  eval_batches = cfg.eval_batches, checkpoint = checkpoint, checkpoint_every = cfg.eval_every,
  resume = cfg.resume, log = cfg.out .. '/metrics.jsonl',
})
print(run)

local val = train.evaluate(model, corpus, {seq = cfg.seq, batches = 32, batch = cfg.batch})
print(('val loss %.4f nats/token (%.3f bits) over %d tokens'):format(val.nats, val.bits, val.tokens))
-- what this run was, for whoever reads its numbers later
local record = provenance.record{corpus = corpus, model = model, run = run, config = cfg}
require('anatomy.io.fs').write_atomic(cfg.out .. '/run.json', require('anatomy.io.json').encode({provenance = record,
  val = {nats = val.nats, bits = val.bits, tokens = val.tokens}}) .. '\n')
print(('checkpoint: %s   metrics: %s   run: %s'):format(checkpoint, cfg.out .. '/metrics.jsonl', cfg.out .. '/run.json'))
print('provenance: ' .. provenance.line(record))
if cfg.sample > 0 then
  local sample = corpus:sample(model, '', {max_new = cfg.sample, temperature = cfg.temperature,
    top_k = cfg.top_k > 0 and cfg.top_k or nil, seed = cfg.seed})
  print('\n' .. sample)
  print(('\n(zlib compression ratio of the sample: %.3f)'):format(text.compression_ratio(sample)))
end
