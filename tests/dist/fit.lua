-- The run tests/dist/test_data_parallel.lua compares: a one-layer GPT trained
-- on a short text, in one process or as one rank of several.
--   anatomy [--nproc N] fit.lua --out=DIR [--batch=32] [--steps=50] [--stop_at=S] [--kill_at=S]
-- Writes (rank 0) DIR/metrics.jsonl, DIR/run.ckpt and DIR/probes.json (the
-- autopsy's measures at steps 1, 25 and 50),
-- and every rank its parameters as DIR/params.RANK.safetensors.
local o = torch.config.parse({out = '', batch = 32, steps = 50, stop_at = 0, kill_at = 0, bucket_mb = 25}, arg)
assert(o.out ~= '', 'fit.lua: --out=DIR is required')
local lines = {
  'so shaken as we are, so wan with care, find we a time for frighted peace to pant,',
  'and breathe short-winded accents of new broils to be commenced in strands afar remote.',
  'no more the thirsty entrance of this soil shall daub her lips with her own children\'s blood;',
  'nor more shall trenching war channel her fields, nor bruise her flowerets with the armed hoofs',
}
local c = data.from_string(table.concat(lines, '\n'):rep(12))
torch.manual_seed(11 + dist.rank())  -- different on every rank: train.fit must broadcast rank 0's weights
local m = models.gpt{vocab = c.vocab_size, dim = 32, heads = 2, layers = 1, seq = 32, ffn = 64}
torch.manual_seed(11)
m = models.gpt{vocab = c.vocab_size, dim = 32, heads = 2, layers = 1, seq = 32, ffn = 64}
if dist.rank() ~= 0 then torch.manual_seed(99) end  -- the batches must not depend on it: train.fit seeds
local run = train.fit(m, c, {steps = o.steps, batch = o.batch, seq = 32, lr = 3e-3, warmup = 5, seed = 5,
  eval_every = 25, eval_batches = 2, checkpoint = o.out .. '/run.ckpt', checkpoint_every = 25,
  log = o.out .. '/metrics.jsonl', quiet = true, bucket_mb = o.bucket_mb, probe = {every = 25},
  on_step = function(step)
    if step == o.stop_at then error(('stopped at step %d on purpose'):format(step)) end
    if step == o.kill_at and dist.rank() == 1 then
      local f = assert(io.open(o.out .. '/killed_at', 'w'))
      f:write(step)
      f:close()
      os.execute('kill -9 ' .. io.open('/proc/self/stat'):read('*l'):match('^%d+'))
    end
  end})
local params = {}
for name, p in m:named_parameters() do params[name] = p:detach() end
torch.save_safetensors(('%s/params.%d.safetensors'):format(o.out, dist.rank()), params)
if dist.rank() == 0 then
  require('anatomy.io.fs').write_atomic(o.out .. '/probes.json', require('anatomy.io.json').encode(run.probes))
  print(('done: %d steps, world %d, loss %.6f, resumed from %s, communication %s'):format(run.steps, run.world_size,
    run.train[#run.train], tostring(run.resumed_from),
    run.communication and ('%d buckets, %.3f s waited'):format(run.communication.buckets, run.communication.wait_seconds) or '-'))
end
