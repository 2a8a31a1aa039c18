-- The tuned lens against the logit lens (Belrose et al., "Eliciting latent
-- predictions from transformers with the tuned lens", 2023). The logit lens
-- reads every layer's residual stream through the final norm and the
-- unembedding as it is; early layers are in another basis, so it reads them
-- badly. The tuned lens trains one affine translator per layer (from the
-- identity, the model frozen) to bring the layer's readout close to the
-- model's final distribution. On a 6-layer GPT trained here on Tiny
-- Shakespeare, character by character:
--   1. per layer, on held-out windows: KL(final || lens) and the loss of each
--      lens (the claim: the tuned lens's KL is below the logit lens's at
--      every layer before the last);
--   2. the trajectory of one line: each lens's top token after each layer,
--      coloured by KL (charts);
--   3. the autopsy with the tuned lens beside the logit lens.
--   anatomy examples/lens.lua [--data=FILE] [--steps=2000] [--lens_steps=400] [--smoke=true] [--out=out/lens]
local cfg = experiment.config({data = '', layers = 6, dim = 128, heads = 4, ffn = 512, seq = 128, steps = 2000, batch = 32,
  lr = 2e-3, seed = 1, lens_steps = 400, lens_batch = 8, lens_lr = 1e-3, eval_windows = 64, out = 'out/lens'},
  {steps = 5, layers = 2, dim = 32, ffn = 64, seq = 32, lens_steps = 3, eval_windows = 4}, arg)
local fs = require('anatomy.io.fs')
local charts = require('anatomy.render.charts')
local page = require('anatomy.render.page')
local Figure = require('anatomy.render.figure')

local corpus, data_ = experiment.corpus(cfg)
torch.manual_seed(cfg.seed)
local model = models.gpt{vocab = corpus.vocab_size, dim = cfg.dim, heads = cfg.heads, layers = cfg.layers, seq = cfg.seq,
  ffn = cfg.ffn, norm = 'pre', activation = 'gelu'}
print(('a %d-layer GPT of %s parameters on %s'):format(cfg.layers, nn.format_count(model:num_parameters()), data_.name))
local run = train.fit(model, corpus, {steps = cfg.steps, batch = cfg.batch, lr = cfg.lr, warmup = math.min(100, cfg.steps),
  seed = cfg.seed, eval_every = math.max(1, math.floor(cfg.steps / 5))})
model:eval()

-- the tuned lens, trained on the training split; everything below reads the validation split
local tuned = lens.tuned(model, corpus, {steps = cfg.lens_steps, batch = cfg.lens_batch, seq = cfg.seq, lr = cfg.lens_lr, seed = cfg.seed})
local logit = lens.logit(model)

-- 1. both lenses on the same held-out windows
torch.manual_seed(cfg.seed + 1)
local x = corpus:batch(cfg.eval_windows, cfg.seq, {split = 'val'})
local e_logit, e_tuned = logit:evaluate(x), tuned:evaluate(x)
local rows, below, xs, names = {}, true, {}, {}
for i, name in ipairs(e_logit.layers) do
  rows[i] = {name, ('%.4f'):format(e_logit.kl[i]), ('%.4f'):format(e_tuned.kl[i]), ('%.4f'):format(e_logit.loss[i]),
    ('%.4f'):format(e_tuned.loss[i])}
  xs[i], names[i - 1] = i - 1, name
  if i < #e_logit.layers and not (e_tuned.kl[i] < e_logit.kl[i]) then below = false end
end
local function list(values, last)
  local out = {}
  for i = 1, last do out[i] = ('%.3f'):format(values[i]) end
  return table.concat(out, ', ')
end
local n = #e_logit.layers - 1  -- the rows before the last (whose readout is the output itself: KL 0 for both)

-- 2. one line of the validation text, read through each lens
local val_text = corpus:decode(corpus:tokens('val'):narrow(1, 1, math.min(4000, corpus:size('val'))))
local line
for l in val_text:gmatch('[^\n]+') do
  if #l >= 30 then line = l:sub(1, math.min(#l, 32, cfg.seq)) break end
end
line = line or val_text:sub(1, math.min(32, cfg.seq))
local t_logit, t_tuned = logit:table(line, {tokenizer = corpus, k = 3}), tuned:table(line, {tokenizer = corpus, k = 3})
local highest = 0  -- one colour scale for both tables
for _, t in ipairs{t_logit, t_tuned} do
  for _, row in ipairs(t.kl) do for _, v in ipairs(row) do highest = math.max(highest, v) end end
end
print('\n' .. tostring(tuned:trajectory(line, {tokenizer = corpus})))

-- 3. the autopsy, both lenses side by side
-- (no attention measures: the lens is the question here, and the report stays small enough to publish)
local a = autopsy.run(model, corpus, {lens = tuned, history = run, config = cfg, seq = cfg.seq,
  metrics = {'grad_norm', 'erank', 'act_std', 'residual', 'influence', 'logit_lens', 'removal', 'weight_erank'}})
print('\n' .. tostring(a))
fs.mkdir(cfg.out)
a:report(cfg.out .. '/autopsy.html')

local r = experiment.results(('The tuned lens against the logit lens on a %d-layer GPT (dim %d, %d steps)'):format(cfg.layers, cfg.dim, cfg.steps),
  data_)
r:run(('%d-layer GPT'):format(cfg.layers), model, run, corpus)
r:add('the tuned lens\'s KL to the final distribution is below the logit lens\'s at every layer before the last',
  'tuned < logit at every layer', ('logit %s; tuned %s (nats, embed then layer 1..%d)'):format(list(e_logit.kl, n), list(e_tuned.kl, n), n - 1),
  below and 'reproduced' or 'differs')
r:add('the logit lens reads early layers worst: its KL falls with depth', 'KL falls with depth',
  ('logit lens KL at embed %.3f, at the middle %.3f, before the last %.3f'):format(e_logit.kl[1], e_logit.kl[math.floor(n / 2) + 1], e_logit.kl[n]),
  e_logit.kl[1] > e_logit.kl[n] and 'reproduced' or 'differs')
r:note(('Measured on %d validation windows of %d characters. The tuned lens: %d steps of %d windows, AdamW lr %g, seed %d, on the training split; '
  .. 'its training KL (mean over layers) went from %.4f to %.4f. Per row (embed: the first block\'s input; then each block\'s output):\n\n%s')
  :format(cfg.eval_windows, cfg.seq, cfg.lens_steps, cfg.lens_batch, cfg.lens_lr, cfg.seed, tuned.history[1], tuned.history[#tuned.history],
    require('anatomy.experiment.results').markdown_table({'row', 'KL logit lens', 'KL tuned lens', 'loss logit lens', 'loss tuned lens'}, rows)))
print('\n' .. tostring(r))

-- the charts: KL and loss by layer for both lenses, and the two tables of one line
local kl_title, loss_title = 'KL(final || lens) after each layer, held-out windows', 'Loss read out after each layer, held-out windows'
local figures = {
  Figure.new(kl_title, charts.lines(kl_title, {{'logit lens', xs, e_logit.kl}, {'tuned lens', xs, e_tuned.kl}},
    {xlabel = 'layer', ylabel = 'KL (nats)', xnames = names}), ''),
  Figure.new(loss_title, charts.lines(loss_title, {{'logit lens', xs, e_logit.loss}, {'tuned lens', xs, e_tuned.loss}},
    {xlabel = 'layer', ylabel = 'loss (nats)', xnames = names, note = ('the model\'s own loss: %.4f'):format(e_logit.loss[#e_logit.loss])}), ''),
  Figure.new('logit lens table', t_logit:svg{range = {0, highest}}, tostring(t_logit)),
  Figure.new('tuned lens table', t_tuned:svg{range = {0, highest}}, tostring(t_tuned)),
}
local html = {}
for i, f in ipairs(figures) do
  html[i] = f.html_figure
  f:save(cfg.out .. '/' .. ({'kl_by_layer.svg', 'loss_by_layer.svg', 'logit_lens_table.svg', 'tuned_lens_table.svg'})[i])
end
fs.write_atomic(cfg.out .. '/lens.html', page.new('The tuned lens against the logit lens', table.concat(html)))
r:save(cfg.out, {config = cfg})
