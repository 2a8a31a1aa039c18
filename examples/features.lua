-- What features does a layer hold? A 6-layer GPT is trained on Tiny
-- Shakespeare, character by character, at the README's budget
-- (`scripts/main --model=gpt --layers=6 --steps=3000`: dim 64, 2 heads,
-- 64-character windows), and a TopK sparse autoencoder is trained on the
-- residual stream after its middle layer (blocks.3.resid_post):
--   1. the SAE's reconstruction: explained variance, L0, dead features, and
--      the loss with the reconstruction in place of the layer's output (CE
--      loss recovered, against zeroing it);
--   2. with the error term spliced in, the model's logits are the clean
--      ones bit for bit, and the features are hook points;
--   3. the top-activating contexts of the busiest features, and a feature
--      page each (out/features/feature_N.html);
--   4. the autopsy with the SAE: the middle layer's row says how many
--      features it uses beside its effective rank.
--   anatomy examples/features.lua [--steps=3000] [--sae_steps=3000] [--smoke=true] [--out=out/features]
local cfg = experiment.config({data = '', dim = 64, heads = 2, layers = 6, ffn = 128, seq = 64, steps = 3000, batch = 32,
  lr = 3e-3, warmup = 50, seed = 1337, point = 'blocks.3.resid_post', width = 512, k = 32, sae_steps = 3000, sae_batch = 1024,
  sae_lr = 1e-3, eval_batches = 16, pages = 4, out = 'out/features'},
  {steps = 30, sae_steps = 30, sae_batch = 128, width = 64, k = 8, eval_batches = 2, pages = 1}, arg)
local fs = require('anatomy.io.fs')

local corpus, data_ = experiment.corpus(cfg)
torch.manual_seed(cfg.seed)
local model = models.gpt{vocab = corpus.vocab_size, dim = cfg.dim, heads = cfg.heads, layers = cfg.layers, ffn = cfg.ffn, seq = cfg.seq}
print(('a GPT of %s parameters on %s, %d steps'):format(nn.format_count(model:num_parameters()), data_.name, cfg.steps))
local run = train.fit(model, corpus, {steps = cfg.steps, batch = cfg.batch, seq = cfg.seq, lr = cfg.lr, warmup = cfg.warmup,
  seed = cfg.seed, eval_every = math.max(1, math.floor(cfg.steps / 5))})
model:eval()

-- 1. the SAE and how much of the layer it keeps
print(('\na TopK SAE (k %d, %d features) on %s'):format(cfg.k, cfg.width, cfg.point))
local s, history = sae.train(model, corpus, {point = cfg.point, kind = 'topk', k = cfg.k, width = cfg.width, steps = cfg.sae_steps,
  batch = cfg.sae_batch, lr = cfg.sae_lr, seq = cfg.seq, seed = cfg.seed})
local e = sae.evaluate(model, s, corpus, {batches = cfg.eval_batches, batch = 16, seq = cfg.seq})
print('\n' .. tostring(e))
fs.mkdir(cfg.out)
s:save(cfg.out .. '/sae')

-- 2. spliced in with its error term, nothing changes
local x = corpus:tokens('val'):narrow(1, 1, 8 * cfg.seq):view(8, cfg.seq)
local clean = model(x)
local h = sae.attach(model, s, {error_term = true})
local logits, cache = probe.run_with_cache(model, x, {filter = {cfg.point .. '.sae.acts'}})
h:remove()
local same = torch.equal(logits, clean)

-- 3. the busiest features' top contexts and pages
local density = e.density
local order = select(2, density:sort(1, true))
local busiest = {}
for i = 1, math.min(cfg.pages, cfg.width) do busiest[i] = order[i]:item() end
local top = sae.top_activations(model, s, corpus, {features = busiest, k = 12, context = 24, seq = cfg.seq})
print('\n' .. tostring(top))
for _, f in ipairs(busiest) do top:save(f, ('%s/feature_%d.html'):format(cfg.out, f)) end

-- 4. the autopsy with the SAE
local a = autopsy.run(model, corpus, {steps = 4, batch = cfg.batch, history = run, saes = {s}, config = cfg})
print('\n' .. tostring(a))
a:report(cfg.out .. '/autopsy.html')

-- the claims
local r = experiment.results(('Features of a 6-layer GPT\'s middle layer (dim %d, trained here on %s)'):format(cfg.dim, data_.name), data_)
r:run('model', model, run, corpus)
r:add(('a TopK SAE on %s explains >= 90%% of its variance at L0 <= 32, with under 10%% of its features dead'):format(cfg.point),
  'EV >= 0.9, L0 <= 32, dead < 10%', ('EV %.4f, L0 %.2f, dead %.1f%% (%d of %d features never fire on %d val tokens)'):format(
    e.explained_variance or 0 / 0, e.l0, 100 * e.dead, math.floor(e.dead * cfg.width + 0.5), cfg.width, e.tokens),
  e.explained_variance and e.explained_variance >= 0.9 and e.l0 <= 32 and e.dead < 0.1 and 'reproduced' or 'differs')
r:add('with the reconstruction in place of the layer\'s output, most of the loss that zeroing it costs is recovered',
  'CE loss recovered >= 0.9', e.ce_recovered and ('%.4f (clean %.4f, spliced %.4f, zeroed %.4f nats)'):format(e.ce_recovered,
    e.ce_clean, e.ce_spliced, e.ce_zero) or e.notes[1], e.ce_recovered and e.ce_recovered >= 0.9 and 'reproduced' or 'differs')
r:add('spliced in with its error term, the model\'s logits are the clean ones bit for bit', 'identical',
  same and 'identical' or ('differ by up to %.3g'):format((logits - clean):abs():max():item()), same and 'reproduced' or 'differs')
local t = s.cfg.trained  -- what sae.train ran with, defaults included
r:note(('SAE: TopK, k %d, %d features (%dx the width %d), %d steps of %d rows (%d-character windows, %d per forward, shuffled '
  .. 'through a buffer), Adam at lr %g, the auxiliary-k loss on dead features (k_aux %d, coefficient %g). Evaluated on the first '
  .. '%d windows of the validation split. Its features at %s.sae.acts, cached over 8 windows: %s.'):format(s.cfg.k, s.cfg.d_sae,
  s.cfg.d_sae / s.cfg.d_in, s.cfg.d_in, t.steps, t.batch, t.seq, t.sequences, t.lr, t.k_aux, t.aux_coefficient, e.tokens / t.seq,
  cfg.point, require('anatomy.render.format').shape(cache[cfg.point .. '.sae.acts'])))
local rows = {}
for i, step in ipairs(history.step) do
  rows[i] = {tostring(step), ('%.4f'):format(history.loss[i]), ('%.1f'):format(history.l0[i]),
    ('%.3f'):format(history.explained_variance[i]), ('%.1f%%'):format(100 * history.dead[i])}
end
r:note('The SAE\'s training (explained variance on each logged step\'s batch, against the variance of the first buffer):\n\n' ..
  require('anatomy.experiment.results').markdown_table({'step', 'loss', 'L0', 'explained variance', 'dead'}, rows))
local feature_rows = {}
for i, f in ipairs(busiest) do
  local c = top[f][1]
  feature_rows[i] = {tostring(f), ('%.4f'):format(density[f]:item()),
    c and ('`%s[%s]%s`'):format(c.before:gsub('\n', ' '), c.token:gsub('\n', '\\n'), c.after:gsub('\n', ' ')) or '-'}
end
r:note('The busiest features (density: the share of val tokens each fires on) and the context where each fires hardest, '
  .. 'its token in brackets; each has a page, feature_N.html:\n\n'
  .. require('anatomy.experiment.results').markdown_table({'feature', 'density', 'top context'}, feature_rows))
print('\n' .. tostring(r))
r:save(cfg.out, {config = cfg})
