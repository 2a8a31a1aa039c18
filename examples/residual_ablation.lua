-- Residual ablation: a character transformer (dim 64, context 64, 2 heads,
-- FFN 64 -> 128 -> 64 with ReLU, post-norm LayerNorm) trained on Tiny
-- Shakespeare with and without its residual adds.
-- Claims (the post): one layer reaches a train loss of ~1.70 with residuals
-- and ~2.47 without; in the run without, gradient norms are ~0.006 at the
-- token embedding and ~0.16 at the head: the gradient no longer reaches the
-- input. The post's title claim is about depth (the ResNet observation: more
-- layers meant a worse model until residuals), so the same pair is swept over
-- 1, 2, 4 and 8 layers, every run with the same steps and tokens.
-- Settings: AdamW (betas 0.9/0.95, weight decay 0.1 on matrices), cosine
-- schedule from lr 3e-3 with 100 warmup steps, clipping at 1; and, nearer the
-- post's code, the one-layer pair again with plain Adam (betas 0.9/0.999, no
-- weight decay), a constant lr of 1e-3, no warmup and no clipping.
--   anatomy examples/residual_ablation.lua [--data=FILE] [--steps=5000] [--depths=1,2,4,8] [--smoke=true]
local cfg = experiment.config({data = '', steps = 5000, batch = 32, lr = 3e-3, warmup = 100, log_every = 500,
  depths = '1,2,4,8', adam_lr = 1e-3, eval_batches = 16, seed = 1337, out = 'out/residual_ablation'},
  {steps = 20, log_every = 10, warmup = 2, depths = '1,2', eval_batches = 2}, arg)

local corpus, data_ = experiment.corpus(cfg)
local r = experiment.results(('Residual ablation (char transformer, dim 64, %d steps per run)'):format(cfg.steps), data_)

local function mean_tail(list, n)
  local s, k = 0, 0
  for i = math.max(1, #list - n + 1), #list do s, k = s + list[i], k + 1 end
  return s / k
end

-- Trains one model; returns its measurements (train loss as the mean of the
-- last 100 steps, val loss, the last probed gradient norms) and the model.
local function train_one(layers, residual, setting)
  torch.manual_seed(cfg.seed)
  local model = models.gpt{vocab = corpus.vocab_size, dim = 64, heads = 2, layers = layers, seq = 64, ffn = 128,
    residual = residual, norm = 'post', activation = 'relu'}
  local label = ('%d layer%s, %s residuals%s'):format(layers, layers > 1 and 's' or '', residual and 'with' or 'without',
    setting == 'adam' and ', plain Adam' or '')
  print(('\n== %s: %s parameters'):format(label, nn.format_count(model:num_parameters())))
  local opts = {steps = cfg.steps, batch = cfg.batch, lr = cfg.lr, warmup = cfg.warmup, eval_every = cfg.log_every,
    seed = cfg.seed, probe = {every = cfg.log_every}}
  if setting == 'adam' then
    opts.lr, opts.schedule, opts.warmup, opts.clip, opts.weight_decay, opts.betas = cfg.adam_lr, 'constant', 0, 0, 0, {0.9, 0.999}
  end
  local run = train.fit(model, corpus, opts)
  r:run(label, model, run, corpus)
  local last = run.probes[#run.probes]
  return {train_loss = mean_tail(run.train, 100),
    val_loss = train.evaluate(model, corpus, {seq = 64, batches = cfg.eval_batches, batch = cfg.batch}).nats,
    embed_grad = last.grad_norm['embed.weight'], head_grad = last.grad_norm['head.weight']}, model, run
end

local one, autopsies = {}, {}
local depths = {}
for d in cfg.depths:gmatch('%d+') do depths[#depths + 1] = tonumber(d) end
local sweep = experiment.sweep({{'layers', depths}, {'residual', {true, false}}}, function(c)
  local m, model, run = train_one(c.layers, c.residual)
  if c.layers == 1 then
    one[c.residual] = m
    local a = autopsy.run(model, corpus, {history = run, batch = cfg.batch})
    a:report(('%s/%s.html'):format(cfg.out, c.residual and 'with_residual' or 'no_residual'))
    autopsies[c.residual] = a
  end
  return m
end, {columns = {'train_loss', 'val_loss', 'embed_grad', 'head_grad'}})
-- the 1-layer model with and without residuals side by side, one report
if autopsies[true] and autopsies[false] then
  local comparison = autopsy.compare({{'with residuals', autopsies[true]}, {'without residuals', autopsies[false]}})
  print('\n' .. tostring(comparison))
  print('comparison report: ' .. comparison:report(cfg.out .. '/compare.html'))
end
local adam = {}
for _, residual in ipairs{true, false} do adam[residual] = train_one(1, residual, 'adam') end

local with, without = one[true], one[false]
r:add('1 layer: train loss with residuals (mean of the last 100 steps)', '~1.70', with.train_loss, experiment.verdict(with.train_loss, 1.55, 1.85))
r:add('1 layer: train loss without residuals', '~2.47', without.train_loss, experiment.verdict(without.train_loss, 2.30, 2.65))
r:add('1 layer, no residuals: grad norm of the token embedding', '~0.006', without.embed_grad, experiment.verdict(without.embed_grad, 0.002, 0.018))
r:add('1 layer, no residuals: grad norm of the head', '~0.16', without.head_grad, experiment.verdict(without.head_grad, 0.05, 0.5))
r:add('1 layer, with residuals: grad norm of the token embedding', '(larger than without)', with.embed_grad,
  with.embed_grad > without.embed_grad and 'reproduced' or 'differs')
r:add('1 layer, plain Adam: train loss with residuals', '~1.70', adam[true].train_loss, experiment.verdict(adam[true].train_loss, 1.55, 1.85))
r:add('1 layer, plain Adam: train loss without residuals', '~2.47', adam[false].train_loss, experiment.verdict(adam[false].train_loss, 2.30, 2.65))
-- depth: without residuals, does loss get worse as layers are added, while with residuals it improves?
local by = {}
for _, row in ipairs(sweep.rows) do by[row.layers .. tostring(row.residual)] = row end
local worse, better = 0, 0
for i = 2, #depths do
  if by[depths[i] .. 'false'].train_loss > by[depths[i - 1] .. 'false'].train_loss then worse = worse + 1 end
  if by[depths[i] .. 'true'].train_loss < by[depths[i - 1] .. 'true'].train_loss then better = better + 1 end
end
local deepest = depths[#depths]
r:add(('without residuals, train loss rises with depth (steps %s where it rises)'):format(cfg.depths), 'more layers, worse model',
  ('%d of %d'):format(worse, #depths - 1), worse == #depths - 1 and 'reproduced' or 'differs')
r:add(('with residuals, train loss falls with depth (steps where it falls)'), '(deeper is better)',
  ('%d of %d'):format(better, #depths - 1), better == #depths - 1 and 'reproduced' or 'differs')
local gap = by[deepest .. 'false'].train_loss - by[deepest .. 'true'].train_loss
r:add(('%d layers: train loss without minus with residuals'):format(deepest), '> 0 (residuals needed)', gap, gap > 0.05 and 'reproduced' or 'differs')
r:note(('Depth sweep: every run %d steps of %d x 64 tokens, seed %d; train loss is the mean of the last 100 steps, val loss is over %d x %d validation windows. '
  .. 'Plain Adam: betas 0.9/0.999, eps 1e-8, no weight decay, constant lr %s, no warmup, no clipping.')
  :format(cfg.steps, cfg.batch, cfg.seed, cfg.eval_batches, cfg.batch, tostring(cfg.adam_lr)))
r:sweep('Depth sweep', sweep)
print('\n' .. tostring(r))
print()
print(sweep)
sweep:report(cfg.out .. '/depth_sweep.html', 'Residual ablation: depth sweep')
r:save(cfg.out, {config = cfg})
print(('\nresults: %s/results.md, %s/results.json\nreports: %s/with_residual.html, %s/no_residual.html, %s/depth_sweep.html')
  :format(cfg.out, cfg.out, cfg.out, cfg.out, cfg.out))
