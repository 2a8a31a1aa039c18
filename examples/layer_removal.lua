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
local a = autopsy.run(model, corpus, {history = run, batch = cfg.batch, steps = 4, k = cfg.k})
print(a)
a:report(cfg.out .. '/autopsy.html')

-- the same number of the MOST influential blocks, for contrast
local rows = {}
for _, row in ipairs(a.rows) do if row.kind == 'block' then rows[#rows + 1] = row end end
table.sort(rows, function(p, q) return p.influence > q.influence end)
local handles = {}
for i = 1, cfg.k do handles[i] = probe.skip(model, rows[i].name) end
local worst = train.evaluate(model, corpus, {seq = cfg.seq, batches = 4, batch = cfg.batch}).nats
for _, h in ipairs(handles) do h:remove() end
local full = train.evaluate(model, corpus, {seq = cfg.seq, batches = 4, batch = cfg.batch}).nats
local low_names = a.removal.blocks
local hs = {}
for i, n in ipairs(low_names) do hs[i] = probe.skip(model, n) end
local cheap = train.evaluate(model, corpus, {seq = cfg.seq, batches = 4, batch = cfg.batch}).nats
for _, h in ipairs(hs) do h:remove() end

local blocks = {}
for _, row in ipairs(a.rows) do if row.kind == 'block' then blocks[#blocks + 1] = row end end
local middle = blocks[math.floor(#blocks / 2)]

local r = experiment.results(('Layer removal on a %d-layer GPT (dim %d, %d steps)'):format(cfg.layers, cfg.dim, cfg.steps), data_)
r:run(('%d-layer GPT'):format(cfg.layers), model, run, corpus)
r:add(('val loss, full model'):format(), '-', full, '-')
r:add(('val loss without the %d least influential blocks (%s)'):format(cfg.k, table.concat(low_names, ', ')), 'costs little',
  cheap, (cheap - full) / full < 0.05 and 'reproduced' or 'differs')
r:add(('val loss without the %d most influential blocks'):format(cfg.k), '(for contrast)', worst, worst > cheap and 'reproduced' or 'differs')
r:add(('logit lens: top-1 agreement with the final prediction at the middle (%s)'):format(middle.name), 'a good guess by the middle',
  middle.lens_agree, (middle.lens_agree or 0) > 0.5 and 'reproduced' or 'differs')
print('\n' .. tostring(r))
r:save(cfg.out, {config = cfg})
