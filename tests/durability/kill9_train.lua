-- The training run that test_kill9.py kills: a small GPT on a short text,
-- with a checkpoint every few steps and a JSON-lines log, resumed from its
-- checkpoint whenever one is there.
--   anatomy kill9_train.lua --dir=DIR [--steps=120] [--every=4]
local o = torch.config.parse({dir = '', steps = 120, every = 4}, arg)
assert(o.dir ~= '', 'kill9_train.lua: --dir=DIR is required')
local c = data.from_string(('so shaken as we are, so wan with care, find we a time for frighted peace to pant. '):rep(20))
torch.manual_seed(3)
local m = models.gpt{vocab = c.vocab_size, dim = 32, heads = 2, layers = 2, seq = 32, ffn = 64}
local run = train.fit(m, c, {steps = o.steps, batch = 4, seq = 32, lr = 3e-3, warmup = 5, seed = 5, eval_every = 10 ^ 9,
  checkpoint = o.dir .. '/run.ckpt', checkpoint_every = o.every, log = o.dir .. '/metrics.jsonl', quiet = true})
print(('done: %d steps, resumed from %s'):format(o.steps, tostring(run.resumed_from)))
