-- VibeNet autopsy: parameter-free attention, RMSNorm, identity residual,
-- expansion d -> 3d + GELU, untied head. Claims (from the seed article, at
-- vocab 64000, dim 512, ~132M parameters):
--   the gradient is large at the input boundary (token embedding) and the
--   output boundary (expansion, head) and ~0 in every middle block, at every
--   depth tried (2, 8, 12 layers); the token embedding's effective rank is ~5%
--   of its dimension (26/512); the head's rank collapses to a handful (2.9-6.5);
--   at initialisation in high dimension attention is near-identity (entropy
--   ~0, diagonal ~1).
-- Reduced scale here (2 CPU cores): characters, dim 128, a few hundred steps
-- per depth. --dim=512 --tokenizer=sentencepiece --vocab_size=64000 is the
-- article's configuration, for a GPU.
--   anatomy examples/vibenet_autopsy.lua [--data=FILE] [--smoke=true]
local cfg = experiment.config({data = '', tokenizer = 'char', vocab_size = 4000, dim = 128, seq = 64, steps = 400,
  batch = 32, lr = 3e-3, seed = 1337, depths = '2,8,12', init_dim = 512, out = 'out/vibenet_autopsy'},
  {steps = 5, depths = '2,3', dim = 32, init_dim = 64}, arg)

local corpus, data_ = experiment.corpus(cfg, {tokenizer = cfg.tokenizer, vocab_size = cfg.vocab_size})
local r = experiment.results(('VibeNet autopsy (dim %d, %s tokens, %d steps per depth)'):format(cfg.dim, cfg.tokenizer, cfg.steps), data_)

-- attention at initialisation, in high dimension
torch.manual_seed(cfg.seed)
local fresh = models.vibenet{vocab = corpus.vocab_size, dim = cfg.init_dim, layers = 2, seq = cfg.seq}
local x = corpus:batch(4, cfg.seq, {split = 'val'})
local cap = probe.capture(fresh, {filter = '*.pattern'}, function() torch.no_grad(function() fresh(x) end) end)
local p0 = cap['blocks.1.inner.attn.pattern']
local h0, d0 = torch.metrics.attention_entropy(p0), torch.metrics.diagonal_mass(p0)
r:add(('at init (dim %d): attention entropy'):format(cfg.init_dim), '~0', h0, experiment.verdict(h0, 0, 0.1))
r:add(('at init (dim %d): diagonal mass'):format(cfg.init_dim), '~1', d0, experiment.verdict(d0, 0.95, 1))

for depth in cfg.depths:gmatch('%d+') do
  depth = tonumber(depth)
  torch.manual_seed(cfg.seed)
  local model = models.vibenet{vocab = corpus.vocab_size, dim = cfg.dim, layers = depth, seq = cfg.seq}
  print(('\n== %d layers: %s parameters'):format(depth, nn.format_count(model:num_parameters())))
  local run = train.fit(model, corpus, {steps = cfg.steps, batch = cfg.batch, lr = cfg.lr, warmup = math.min(50, cfg.steps),
    seed = cfg.seed, probe = {every = math.max(1, math.floor(cfg.steps / 8))}})
  r:run(('%d layers'):format(depth), model, run, corpus)
  local a = autopsy.run(model, corpus, {history = run, batch = cfg.batch, steps = 2, probe_text = 'In the beginning'})
  print(a)
  a:report(('%s/vibenet_%dlayers.html'):format(cfg.out, depth))
  local boundary_max, middle_max = 0, 0
  for _, row in ipairs(a.rows) do
    if row.kind == 'block' then middle_max = math.max(middle_max, row.grad_share or 0)
    else boundary_max = math.max(boundary_max, row.grad_share or 0) end
  end
  r:add(('%d layers: largest middle-block gradient / largest boundary gradient'):format(depth), '~0',
    middle_max / math.max(boundary_max, 1e-12), experiment.verdict(middle_max / math.max(boundary_max, 1e-12), 0, 0.1))
  local rank = {}
  for _, w in ipairs(a.weights) do rank[w.name] = w end
  local emb = rank['embed.weight']
  r:add(('%d layers: token embedding erank / dim'):format(depth), '~0.05 (26/512)', emb.erank / cfg.dim,
    experiment.verdict(emb.erank / cfg.dim, 0.02, 0.1))
  local head = rank['head.weight']
  r:add(('%d layers: head effective rank'):format(depth), '2.9-6.5', head.erank, experiment.verdict(head.erank, 2.9, 6.5))
end
print('\n' .. tostring(r))
r:save(cfg.out, {config = cfg})
