-- Layer removal (ShortGPT): removing the layers with the lowest block
-- influence (1 - cos(input, output)) costs little, and the logit lens shows
-- a good guess forming by the middle of the stack. Run on a GPT of 8 layers
-- trained on the corpus (reduced scale: characters, dim 128).
--   anatomy examples/layer_removal.lua [--data=FILE] [--smoke=true]
local cfg = experiment.config({data = '', dim = 128, heads = 4, layers = 8, ffn = 512, seq = 64, steps = 1500, batch = 32,
  lr = 2e-3, seed = 1337, k = 2, out = 'out/layer_removal'}, {steps = 5, dim = 32, layers = 4, ffn = 64, k = 1}, arg)

local corpus, data_ = experiment.corpus(cfg)
torch.manual_seed(cfg.seed)
local model = models.gpt{vocab = corpus.vocab_size, dim = cfg.dim, heads = cfg.heads, layers = cfg.layers, seq = cfg.seq,
  ffn = cfg.ffn, norm = 'pre', activation = 'gelu'}
print(('%s parameters'):format(nn.format_count(model:num_parameters())))
local run = train.fit(model, corpus, {steps = cfg.steps, batch = cfg.batch, lr = cfg.lr, warmup = math.min(100, cfg.steps),
  seed = cfg.seed, probe = {every = math.max(1, math.floor(cfg.steps / 10))}})
-- One set of validation windows for every number below: the autopsy's full
-- loss and its removal of the k least influential blocks, and the removal of
-- the k most influential, are all losses on these 4 x batch windows.
local xs, ys = {}, {}
for i = 1, 4 do xs[i], ys[i] = corpus:batch(cfg.batch, cfg.seq, {split = 'val'}) end
local x, y = torch.cat(xs, 1), torch.cat(ys, 1)
local a = autopsy.run(model, {x, y}, {history = run, k = cfg.k})
print(a)
a:report(cfg.out .. '/autopsy.html')
local function loss_on_windows(skipped)
  local hs = {}
  for i, n in ipairs(skipped) do hs[i] = probe.skip(model, n) end
  local loss = torch.no_grad(function() return nn.functional.cross_entropy(model(x), y):item() end)
  for _, h in ipairs(hs) do h:remove() end
  return loss
end

-- the same number of the MOST influential blocks, for contrast
local rows = {}
for _, row in ipairs(a.rows) do if row.kind == 'block' then rows[#rows + 1] = row end end
table.sort(rows, function(p, q) return p.influence > q.influence end)
local most = {}
for i = 1, cfg.k do most[i] = rows[i].name end
local worst = loss_on_windows(most)
local full, cheap = a.loss, a.removal.loss
local low_names = a.removal.blocks

local blocks = {}
for _, row in ipairs(a.rows) do if row.kind == 'block' then blocks[#blocks + 1] = row end end
local middle = blocks[math.floor(#blocks / 2)]

local r = experiment.results(('Layer removal on a %d-layer GPT (dim %d, %d steps)'):format(cfg.layers, cfg.dim, cfg.steps), data_)
r:run(('%d-layer GPT'):format(cfg.layers), model, run, corpus)
local windows = ('%d validation windows of %d tokens, the same for every loss here and in the autopsy'):format(x:size(1), cfg.seq)
r:add(('val loss, full model (%s)'):format(windows), '-', full, '-')
r:add(('val loss without the %d least influential blocks (%s)'):format(cfg.k, table.concat(low_names, ', ')), 'costs little',
  cheap, (cheap - full) / full < 0.05 and 'reproduced' or 'differs')
r:add(('val loss without the %d most influential blocks'):format(cfg.k), '(for contrast)', worst, worst > cheap and 'reproduced' or 'differs')
r:add(('logit lens: top-1 agreement with the final prediction at the middle (%s)'):format(middle.name), 'a good guess by the middle',
  middle.lens_agree, (middle.lens_agree or 0) > 0.5 and 'reproduced' or 'differs')
print('\n' .. tostring(r))
r:save(cfg.out, {config = cfg})
