-- Residual ablation: the one-layer character transformer (dim 64, context 64,
-- 2 heads, FFN 64 -> 128 -> 64 with ReLU, post-norm LayerNorm) trained on Tiny
-- Shakespeare with and without its two residual adds.
-- Claim: train loss ~1.70 with residuals and ~2.47 without; in the run without,
-- gradient norms (logged every 500 steps) are ~0.006 at the token embedding
-- and ~0.16 at the head: the gradient no longer reaches the input.
--   anatomy examples/residual_ablation.lua [--data=FILE] [--steps=5000] [--smoke=true]
local cfg = experiment.config({data = '', steps = 5000, batch = 32, lr = 3e-3, warmup = 100, log_every = 500,
  seed = 1337, out = 'out/residual_ablation'}, {steps = 20, log_every = 10, warmup = 2}, arg)

local corpus, source = experiment.corpus(cfg.data)
print('data: ' .. source)
os.execute(("mkdir -p '%s'"):format(cfg.out))

local function mean_tail(list, n)
  local s, k = 0, 0
  for i = math.max(1, #list - n + 1), #list do s, k = s + list[i], k + 1 end
  return s / k
end

local measured = {}
for _, residual in ipairs{true, false} do
  local label = residual and 'with residuals' or 'without residuals'
  torch.manual_seed(cfg.seed)
  local model = models.gpt{vocab = corpus.vocab_size, dim = 64, heads = 2, layers = 1, seq = 64, ffn = 128,
    residual = residual, norm = 'post', activation = 'relu'}
  print(('\n== %s: %s parameters'):format(label, nn.format_count(model:num_parameters())))
  local run = train.fit(model, corpus, {steps = cfg.steps, batch = cfg.batch, lr = cfg.lr, warmup = cfg.warmup,
    eval_every = cfg.log_every, seed = cfg.seed, probe = {every = cfg.log_every}})
  print(('%-6s  %12s  %12s  %12s'):format('step', '|grad| embed', '|grad| attn', '|grad| head'))
  for _, rec in ipairs(run.probes) do
    print(('%-6d  %12s  %12s  %12s'):format(rec.step, autopsy.format(rec.grad_norm['embed.weight'], 4),
      autopsy.format(rec.grad_norm['blocks.1.attn.qkv.weight'], 4), autopsy.format(rec.grad_norm['head.weight'], 4)))
  end
  local last = run.probes[#run.probes]
  measured[residual] = {loss = mean_tail(run.train, 100), embed = last.grad_norm['embed.weight'], head = last.grad_norm['head.weight']}
  local a = autopsy.run(model, corpus, {history = run, batch = cfg.batch})
  a:report(('%s/%s.html'):format(cfg.out, residual and 'with_residual' or 'no_residual'))
end

local r = experiment.results('Residual ablation (one-layer char transformer, ' .. cfg.steps .. ' steps)')
r:add('train loss with residuals (mean of the last 100 steps)', '~1.70', measured[true].loss, experiment.verdict(measured[true].loss, 1.55, 1.85))
r:add('train loss without residuals', '~2.47', measured[false].loss, experiment.verdict(measured[false].loss, 2.30, 2.65))
r:add('no residuals: grad norm of the token embedding', '~0.006', measured[false].embed, experiment.verdict(measured[false].embed, 0.002, 0.018))
r:add('no residuals: grad norm of the head', '~0.16', measured[false].head, experiment.verdict(measured[false].head, 0.05, 0.5))
r:add('with residuals: grad norm of the token embedding', '(larger than without)', measured[true].embed,
  measured[true].embed > measured[false].embed and 'reproduced' or 'differs')
print('\n' .. tostring(r))
r:save(cfg.out .. '/results.md')
print(('\nreports: %s/with_residual.html, %s/no_residual.html'):format(cfg.out, cfg.out))
