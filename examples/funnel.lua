-- Funnel: progressive width. Each stage runs several parameter-free
-- attentions at its width, then a learned down-projection, with more
-- attentions as the width shrinks (512 -> 256 -> 128 -> 64 with 3/4/8/16 in
-- the post) so that each stage spends about the same attention compute.
-- Compared with a VibeNet of about the same parameter count, trained for the
-- same wall-clock time: loss per training second, and effective rank by stage.
-- Reduced scale: widths 256 -> 128 -> 64 -> 32, characters.
--   anatomy examples/funnel.lua [--data=FILE] [--seconds=90] [--smoke=true]
local cfg = experiment.config({data = '', widths = '256,128,64,32', attentions = '3,4,8,16', seq = 64, seconds = 90,
  batch = 32, lr = 3e-3, seed = 1337, out = 'out/funnel'}, {seconds = 2, widths = '32,16', attentions = '1,2'}, arg)

local function numbers(s) local out = {} for n in s:gmatch('%d+') do out[#out + 1] = tonumber(n) end return out end
local widths, attentions = numbers(cfg.widths), numbers(cfg.attentions)
local corpus, data_ = experiment.corpus(cfg)

torch.manual_seed(cfg.seed)
local funnel = models.funnel{vocab = corpus.vocab_size, seq = cfg.seq, widths = widths, attentions = attentions}
-- the VibeNet (plain blocks, as many layers as the funnel has attentions) whose width gives the nearest parameter count
local layers = 0
for _, n in ipairs(attentions) do layers = layers + n end
local best, best_gap
for dim = 8, 1024, 8 do
  local n = models.vibenet{vocab = corpus.vocab_size, dim = dim, layers = 1, seq = cfg.seq}:num_parameters() + (layers - 1) * dim
  local gap = math.abs(n - funnel:num_parameters())
  if not best_gap or gap < best_gap then best, best_gap = dim, gap end
end
local vibenet = models.vibenet{vocab = corpus.vocab_size, dim = best, layers = layers, seq = cfg.seq}

-- attention compute per stage: heads x T^2 x width per attention, times attentions
local compute = {}
for s, w in ipairs(widths) do compute[s] = attentions[s] * cfg.seq * cfg.seq * w end
local cmin, cmax = math.huge, 0
for _, c in ipairs(compute) do cmin, cmax = math.min(cmin, c), math.max(cmax, c) end

local results = {}
for _, entry in ipairs{{'funnel', funnel}, {'vibenet', vibenet}} do
  local name, model = entry[1], entry[2]
  print(('\n== %s: %s parameters'):format(name, nn.format_count(model:num_parameters())))
  torch.manual_seed(cfg.seed)
  local run = train.fit(model, corpus, {steps = 1000000, seconds = cfg.seconds, batch = cfg.batch, lr = cfg.lr,
    warmup = 50, eval_every = 1000000, schedule = 'constant', seed = cfg.seed, probe = {every = 100}})
  local val = train.evaluate(model, corpus, {seq = cfg.seq, batches = 8, batch = cfg.batch}).nats
  local a = autopsy.run(model, corpus, {history = run, batch = cfg.batch, metrics = {'grad_norm', 'erank', 'act_std'}})
  print(a)
  a:report(('%s/%s.html'):format(cfg.out, name))
  results[name] = {run = run, val = val, steps = run.steps, seconds = run.seconds, params = model:num_parameters(), autopsy = a}
end
-- the two side by side (their layers differ: the depth curves line them up by position)
local comparison = autopsy.compare({{'funnel', results.funnel.autopsy}, {'vibenet', results.vibenet.autopsy}})
print('\n' .. tostring(comparison))
print('comparison report: ' .. comparison:report(cfg.out .. '/compare.html'))

local function erank_by_stage(a)
  local out = {}
  for _, row in ipairs(a.rows) do
    local stage = row.name:match('^stages%.(%d+)%.')
    if stage and row.erank then out[tonumber(stage)] = ('%s/%d'):format(autopsy.format(row.erank, 1), widths[tonumber(stage)]) end
  end
  return table.concat(out, ', ')
end

local f, v = results.funnel, results.vibenet
local r = experiment.results(('Funnel (%s) vs VibeNet (dim %d, %d layers), %d s of training each'):format(cfg.widths, best, layers, cfg.seconds), data_)
r:run('funnel', funnel, f.run, corpus)
r:run('vibenet', vibenet, v.run, corpus)
r:add('attention compute per stage, largest / smallest', 'about equal', cmax / cmin, cmax / cmin < 2 and 'reproduced' or 'differs')
r:add('parameters, funnel / vibenet', '1 (equal)', f.params / v.params, experiment.verdict(f.params / v.params, 0.9, 1.1))
r:add('val loss after the same training time: funnel', '(compare)', f.val, 'measured')
r:add('val loss after the same training time: vibenet', '(compare)', v.val, 'measured')
r:add('training steps in that time: funnel / vibenet', '(compare)', f.steps / v.steps, 'measured')
r:add('activation erank at the end of each funnel stage', '(reported per stage)', erank_by_stage(f.autopsy), 'measured')
print('\n' .. tostring(r))
r:save(cfg.out, {config = cfg})
