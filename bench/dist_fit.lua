-- One training run for bench/dist.lua: a bench model trained by train.fit in
-- one process or as a rank of `anatomy --nproc N`; rank 0 prints one JSON
-- line: tokens/s over the steps after warm-up, and the time the ranks spent
-- waiting for the gradients' all-reduce after backward.
--   anatomy [--nproc N] bench/dist_fit.lua --model=gpt|vibenet --batch=B --steps=S --warmup=W [--bucket_mb=25]
local native = require('anatomy.torch.native')
local o = torch.config.parse({model = 'gpt', batch = 32, steps = 60, warmup = 10, bucket_mb = 25}, arg)
local text = {}
for i = 1, 4000 do text[i] = ('%d the quick brown fox %s over the lazy dog.'):format(i, i % 3 == 0 and 'jumps' or 'leaps') end
local c = data.from_string(table.concat(text, ' '), {tokenizer = 'byte'})
local configs = {
  gpt = function() return models.gpt{vocab = 256, dim = 64, heads = 2, layers = 1, seq = 64, ffn = 128} end,
  vibenet = function() return models.vibenet{vocab = 256, dim = 128, layers = 4, seq = 128, block = 'plain'} end,
}
local seqs = {gpt = 64, vibenet = 128}
assert(configs[o.model], 'unknown model ' .. o.model)
torch.manual_seed(1)
local m = configs[o.model]()
local marks = {}
local run = train.fit(m, c, {steps = o.steps, batch = o.batch, seq = seqs[o.model], seed = 2, quiet = true,
  eval_every = 10 ^ 9, bucket_mb = o.bucket_mb, on_step = function(step) marks[step] = native.now() end})
if dist.rank() == 0 then
  local timed = o.steps - o.warmup
  local seconds = marks[o.steps] - marks[o.warmup]
  local comm = run.communication or {wait_seconds = 0, seconds = 0, buckets = 0}
  print(require('anatomy.io.json').encode({
    model = o.model, world = dist.world_size(), batch = o.batch, global_batch = o.batch * dist.world_size(),
    seq = seqs[o.model], params = m:num_parameters(), threads = torch.get_num_threads(),
    step_ms = seconds / timed * 1000, tokens_per_second = timed * o.batch * dist.world_size() * seqs[o.model] / seconds,
    run_seconds = run.seconds, wait_seconds = comm.wait_seconds, communication_seconds = comm.seconds,
    buckets = comm.buckets, final_loss = run.train[#run.train], text_sha256 = c._file_info.sha256, text_bytes = c._file_info.bytes}))
end
