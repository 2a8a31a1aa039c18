-- The autopsy (lua/anatomy/autopsy/): its measures on a forward and backward,
-- the verdicts and their thresholds, removal, the table, charts and records.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local native = require('anatomy.torch.native')
local test, eq, close, raises = H.test, H.eq, H.close, H.raises
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')


-- A small gated VibeNet, trained a little, with batches to dissect it on.
local function gated()
  torch.manual_seed(1)
  local corpus = data.from_string(string.rep('the quick brown fox jumps over the lazy dog. ', 60))
  local m = models.vibenet{vocab = corpus.vocab_size, dim = 16, layers = 3, seq = 16, block = 'gate'}
  train.fit(m, corpus, {steps = 30, batch = 8, lr = 3e-3, quiet = true})
  local x, y = corpus:batch(4, 16, {split = 'val'})
  return m, x, y
end

-- The loss of a gated VibeNet with block i's forward replaced by step(block, x).
local function loss_by_hand(m, x, y, i, step)
  return torch.no_grad(function()
    local h = m.embed(x)
    for j = 1, #m.blocks do h = j == i and step(m.blocks[j], h) or m.blocks[j](h) end
    return nn.functional.cross_entropy(m.head(m.act(m.expand(h))), y):item()
  end)
end

test("a gated block's f_removal_loss keeps the gate, gate_identity_loss puts x back, and the verdict is f's own", function()
  local m, x, y = gated()
  local a = autopsy.run(m, {x, y})
  local blocks = {}
  for _, r in ipairs(a.rows) do if r.kind == 'block' then blocks[#blocks + 1] = r end end
  for i, r in ipairs(blocks) do
    local f_zeroed = loss_by_hand(m, x, y, i, function(b, h) return b.gate(h) end)
    local gate_is_identity = loss_by_hand(m, x, y, i, function(b, h) return h + b.inner(h) end)
    local skipped = loss_by_hand(m, x, y, i, function(_, h) return h end)
    H.close(r.f_removal_loss, f_zeroed, 1e-5, r.name .. ' f_removal_loss')
    H.close(r.gate_identity_loss, gate_is_identity, 1e-5, r.name .. ' gate_identity_loss')
    H.close(r.removal_loss, skipped, 1e-5, r.name .. ' removal_loss (the whole block skipped, as before)')
    assert(r.f_residual ~= nil and r.f_residual > 0, 'f_residual measured')
  end
  -- f made zero in block 2: the gate alone carries it, so removing the block still costs a lot,
  -- but f does nothing: a passenger by f's own contribution
  torch.no_grad(function() m.blocks[2].inner.ffn.weight:zero_(); m.blocks[2].inner.ffn.bias:zero_() end)
  local b = autopsy.run(m, {x, y})
  local r2 = b.rows[3]
  eq(r2.name, 'blocks.2')
  H.close(r2.f_residual, 0, 1e-6, 'f_residual of a zero f')
  assert(r2.removal_loss - b.loss > 0.01 * b.loss, 'skipping the block (gate and all) raises the loss')
  eq(r2.verdict, 'passenger')
  -- the columns reach every output
  local text = tostring(b)
  for _, c in ipairs{'f_residual', 'f_removal_loss', 'gate_identity_loss'} do
    assert(text:find(c, 1, true), c .. ' in the table')
  end
  local dir = H.tmpdir()
  local html = H.read(b:report(dir .. '/r.html'))
  -- (a header may break after an underscore: <wbr>)
  for _, c in ipairs{'<th>f_<wbr>removal_<wbr>loss</th>', '<th>gate_<wbr>identity_<wbr>loss</th>', '<th>gate_<wbr>grad</th>',
    '<th>gate_<wbr>identity</th>', 'loss with f zeroed and the wrapper'} do
    assert(html:find(c, 1, true), c .. ' in the HTML')
  end
  local csv = H.read(b:csv(dir .. '/r.csv'))
  assert(csv:match('^[^\n]*f_removal_loss'), 'the CSV header')
  local decoded = json.decode(H.read(b:json(dir .. '/r.json')))
  H.close(decoded.rows[3].f_removal_loss, r2.f_removal_loss, 1e-9, 'JSON')
  local c = tostring(autopsy.compare{{'trained', a}, {'f zeroed', b}})
  assert(c:find('f_removal_loss', 1, true) and c:find('gate_identity_loss', 1, true) and c:find('gate_grad', 1, true), 'the comparison')
  os.execute("rm -rf '" .. dir .. "'")
end)

test('exploding is growth that compounds: an unconstrained hyper-connection stack fires, a pre-norm first block does not', function()
  torch.manual_seed(2)
  local V = 20
  local ids, y = torch.randint(1, V + 1, {4, 16}), torch.randint(1, V + 1, {4, 16})
  local h = models.vibenet{vocab = V, dim = 16, layers = 4, seq = 16, block = 'hyper', constraint = 'none'}
  torch.no_grad(function() for i = 1, 4 do h.blocks[i].res_logits:mul_(3) end end)
  local a = autopsy.run(h, {ids, y}, {metrics = {'residual'}})
  for _, r in ipairs(a.rows) do
    if r.kind == 'block' then
      assert(r.amplification > 2, r.name .. ' grows')
      eq(r.verdict, 'exploding', r.name)
    end
  end
  -- pre-norm GPT with a small embedding: the first block scales the stream up once, the rest do not
  torch.manual_seed(3)
  local g = models.gpt{vocab = V, dim = 32, heads = 2, layers = 4, seq = 16, ffn = 64}
  torch.no_grad(function() g.embed.weight:mul_(0.01); g.embed.pos_weight:mul_(0.01) end)
  local b = autopsy.run(g, {ids, y}, {metrics = {'residual'}})
  assert(b.rows[2].amplification > 2, 'the first block amplifies (' .. b.rows[2].amplification .. ')')
  for _, r in ipairs(b.rows) do
    if r.kind == 'block' then assert(r.verdict ~= 'exploding', r.name .. ' is not exploding') end
  end
  assert(tostring(b):find('exploding = amplification > 2 in this block and the one before or after it', 1, true), 'the rule under the table')
end)

test('the per-head entropy chart and the table come from the same batches', function()
  torch.manual_seed(5)
  local corpus = data.from_string(string.rep('to be or not to be, that is the question. ', 40))
  local m = models.gpt{vocab = corpus.vocab_size, dim = 16, heads = 4, layers = 2, seq = 16, ffn = 32}
  local a = autopsy.run(m, corpus, {batch = 4, steps = 3})
  for _, r in ipairs(a.rows) do
    if r.kind == 'block' then
      local heads, sum = a.entropy_heads[r.name], 0
      for _, v in ipairs(heads) do sum = sum + v end
      H.close(sum / #heads, r.entropy, 1e-9, r.name .. ': the mean of the heatmap row against the table')
    end
  end
end)

test('autopsies in one script each record their own start and wall time', function()
  torch.manual_seed(6)
  local ids, y = torch.randint(1, 11, {2, 8}), torch.randint(1, 11, {2, 8})
  local m = models.gpt{vocab = 10, dim = 16, heads = 2, layers = 1, seq = 8, ffn = 32}
  local a = autopsy.run(m, {ids, y})
  local t0 = native.now()
  while native.now() - t0 < 1.2 do end
  local b = autopsy.run(m, {ids, y})
  assert(b.provenance.wall_seconds < 1.0, ('the second autopsy took %.2f s by its record: the first one\'s time counted in'):format(
    b.provenance.wall_seconds))
  assert(a.provenance.started ~= b.provenance.started, 'two start times: ' .. a.provenance.started .. ' and ' .. b.provenance.started)
  local c = tostring(autopsy.compare{a, b})
  assert(c ~= nil)
end)

test("a smoke run's verdicts say so, and a NaN never reaches a verdict", function()
  local Results = experiment.Results
  local r = Results.new('smoke', nil, true)
  r:add('a claim', '1.0', 1.0, 'reproduced')
  eq(r.rows[1].verdict, 'smoke run: not meaningful')
  local s = Results.new('real', nil, false)
  s:add('a NaN', '1.0', 0 / 0, 'differs')
  s:add('a NaN in a text', '1.0', ('circuit >= %.3f'):format(0 / 0), 'differs')
  s:add('fine', '1.0', 1.0, 'reproduced')
  eq({s.rows[1].verdict, s.rows[2].verdict, s.rows[3].verdict}, {'not meaningful (nan)', 'not meaningful (nan)', 'reproduced'})
  local o = Results.new('other text', {comparable = false, name = 'kjv.txt'}, true)
  o:add('c', 'p', 1, 'reproduced')
  eq(o.rows[1].verdict, 'smoke run: not meaningful; not comparable (data: kjv.txt)')
  -- the autopsy of a smoke run (experiment.config with --smoke=true) says it too
  experiment.config({x = 1}, {}, {'--smoke=true'})
  local m = models.gpt{vocab = 10, dim = 16, heads = 2, layers = 1, seq = 8, ffn = 32}
  local a = autopsy.run(m, {torch.randint(1, 11, {2, 8}), torch.randint(1, 11, {2, 8})})
  experiment.smoke = false
  eq(a.rows[2].verdict, 'smoke run: not meaningful')
  eq(autopsy.run(m, {torch.randint(1, 11, {2, 8}), torch.randint(1, 11, {2, 8})}).rows[2].verdict ~= 'smoke run: not meaningful', true)
end)

test("the comparison's depth charts label their axis with the rows' names", function()
  torch.manual_seed(8)
  local ids, y = torch.randint(1, 11, {2, 8}), torch.randint(1, 11, {2, 8})
  local m = models.gpt{vocab = 10, dim = 16, heads = 2, layers = 2, seq = 8, ffn = 32}
  local a, b = autopsy.run(m, {ids, y}), autopsy.run(m, {ids, y})
  local html = require('anatomy.render.page').embed(autopsy.compare{a, b}:html())
  local fig = html:match('grad_norm by depth.-</figure>')
  assert(fig, 'the grad_norm by depth chart')
  for _, name in ipairs{'embed', 'blocks.1', 'blocks.2', 'output'} do
    assert(fig:find('class="xtick" text-anchor="end">' .. name .. '<', 1, true), name .. ' labels the axis')
  end
end)

test('the autopsy names passengers and explosions', function()
  torch.manual_seed(4)
  local Triple = nn.block('Triple', function(self) end)
  function Triple:forward(x) return x * 3 end
  local zero = nn.Linear(16, 16)
  torch.no_grad(function() zero.weight:zero_(); zero.bias:zero_() end)
  local m = models.vibenet{vocab = 20, dim = 16, layers = 4, seq = 8}
  m.blocks[2] = nn.Residual(zero)
  m.blocks[3] = Triple()  -- two in a row: growth that compounds (one alone is not exploding)
  m.blocks[4] = Triple()
  local ids, y = torch.randint(1, 21, {4, 8}), torch.randint(1, 21, {4, 8})
  local a = autopsy.run(m, {ids, y})
  eq(a.rows[3].name, 'blocks.2')
  eq(a.rows[3].verdict, 'passenger')
  close(a.rows[3].residual, 0, 1e-12)
  eq(a.rows[4].verdict, 'exploding')
  eq(a.rows[5].verdict, 'exploding')
  close(a.rows[4].amplification, 3, 1e-5)
  close(a.rows[3].influence, 0, 1e-9, 'an identity block has no influence')
  local s = tostring(a)
  assert(s:find('blocks.2', 1, true) and s:find('passenger', 1, true) and s:find('exploding', 1, true), s)
  local path = os.tmpname()
  a:json(path)
  local text = io.open(path):read('*a')
  assert(text:find('"verdict":"passenger"', 1, true), 'the JSON carries the verdicts')
  os.remove(path)
  local plot = a:plot('amplification')
  assert(plot:find('blocks.3', 1, true))
end)

test('gated blocks report the gate gradient and its distance from the identity', function()
  torch.manual_seed(5)
  local m = models.vibenet{vocab = 20, dim = 16, layers = 2, seq = 8, block = 'gate'}
  torch.no_grad(function() m.blocks[1].gate.weight:copy_(torch.eye(16)) end)
  local a = autopsy.run(m, {torch.randint(1, 21, {4, 8}), torch.randint(1, 21, {4, 8})})
  close(a.rows[2].gate_identity, 0, 1e-12, 'an identity gate is at distance 0')
  assert(a.rows[3].gate_identity > 0.1)
  local g = 0
  for _, p in ipairs(a.params) do if p.name == 'blocks.1.gate.weight' then g = p.grad_norm end end
  close(a.rows[2].gate_grad, g, 1e-12)
  assert(tostring(a):find('gates: blocks.1 gate_grad', 1, true))
  assert(tostring(a):find('blocks.1.gate.weight', 1, true), 'the parameter table lists every parameter')
end)

test('autopsy.step measures from the training step itself; idle probes change nothing', function()
  torch.manual_seed(4)
  local m = models.vibenet{vocab = 11, dim = 8, layers = 2, seq = 6}
  local x, y = torch.randint(1, 12, {2, 6}), torch.randint(1, 12, {2, 6})
  local snap, loss = autopsy.step(m, function()
    local l = nn.functional.cross_entropy(m(x), y)
    l:backward()
    return l
  end)
  eq(#snap.layers, 2)
  close(snap.grad_norm['head.weight'], m.head.weight.grad:norm():item(), 1e-5)
  close(snap.weight_erank['head.weight'], torch.metrics.erank(m.head.weight), 1e-6)
  assert(snap.layers[1].entropy and snap.layers[1].diag and snap.layers[2].act_std, 'per-layer attention and activation stats')
  assert(loss:item() > 0)
  -- each number is its metric's own; the step itself reads nothing back (its
  -- ids trusted as train.fit's are: their range check reads them), and all
  -- of them come back in one read when the snapshot is first looked at
  local pattern, out
  local counts = torch.profiler.count_ops(native.blocks.with_trusted_ids, function()
    snap = autopsy.step(m, function()
      pattern = probe.capture(m, {filter = {'blocks.1.*.pattern', 'blocks.2'}}, function()
        local l = nn.functional.cross_entropy(m(x), y)
        l:backward()
        return l
      end)
    end)
  end)
  eq(counts.syncs, 0, 'reads back to the host in the step with the autopsy')
  eq(torch.profiler.count_ops(function() return snap.layers end).syncs, x.device ~= 'cpu' and 1 or 0, 'the snapshot read in one copy')
  for name, t in pairs(pattern) do
    if name:find('pattern$') then
      close(snap.layers[1].entropy, torch.metrics.attention_entropy(t), 1e-12, 'entropy of blocks.1')
      close(snap.layers[1].diag, torch.metrics.diagonal_mass(t), 1e-12, 'diagonal mass of blocks.1')
    elseif name == 'blocks.2' then
      out = torch.metrics.activation_stats(t)
    end
  end
  assert(out, 'the output of blocks.2 was captured')
  close({snap.layers[2].act_mean, snap.layers[2].act_std, snap.layers[2].act_max, snap.layers[2].act_rms},
    {out.mean, out.std, out.max_abs, out.rms}, 1e-12, 'activation statistics of blocks.2')
  close(snap.grad_norm['expand.weight'], m.expand.weight.grad:norm():item(), 1e-5, 'a gradient norm')
  eq(rawget(m.blocks[1], '_probes'), nil, 'the capture is removed afterwards')
  local before = m(x)
  local h = probe.idle(m, 'blocks.1')
  eq(torch.equal(m(x), before), true, 'an idle probe leaves the output as it was')
  h:remove()
  eq(rawget(m.blocks[1], '_probe'), nil)
end)

test('a block whose removal costs almost nothing is a passenger; unknown plot columns are errors', function()
  torch.manual_seed(4)
  local m = models.vibenet{vocab = 20, dim = 16, layers = 2, seq = 8}
  local ids, y = torch.randint(1, 21, {4, 8}), torch.randint(1, 21, {4, 8})
  local a = autopsy.run(m, {ids, y}, {thresholds = {passenger = 0, passenger_grad = 0, passenger_removal = -math.huge}})
  local row = a.rows[2]
  local cost = (row.removal_loss - a.loss) / a.loss
  eq(row.verdict, 'worker', 'no removal threshold: a worker')
  local just_below = autopsy.run(m, {ids, y}, {thresholds = {passenger = 0, passenger_grad = 0, passenger_removal = cost - 1e-6}})
  eq(just_below.rows[2].verdict, 'worker', ('removing it costs %.3g of the loss, above the threshold'):format(cost))
  local b = autopsy.run(m, {ids, y}, {thresholds = {passenger = 0, passenger_grad = 0, passenger_removal = cost + 1e-6}})
  eq(b.rows[2].verdict, 'passenger', ('removing it costs %.3g of the loss'):format(cost))
  assert(tostring(b):find('or removal_loss - loss < ', 1, true), 'the rule is printed')
  raises(function() a:plot('nonsense') end, "test_autopsy.lua:" .. debug.getinfo(1, 'l').currentline .. ": bad argument #1 to 'plot' (unknown column 'nonsense'; the columns are grad_norm, erank, entropy, diag, "
    .. "act_std, act_mean, act_max, act_rms, amplification, residual, influence, lens_loss, lens_agree, lens_kl, tuned_lens_loss, tuned_kl, removal_loss, f_residual, f_influence, f_removal_loss, gate_identity_loss, gate_grad, gate_identity)")
end)

test('one registry of measures: every list the outputs use is a filter of it, and a row holds what its phases compute', function()
  local measures = autopsy.measures
  -- the lists as they were written out by hand before the registry: the outputs keep them
  eq(autopsy.Autopsy.columns, {'name', 'kind', 'grad_norm', 'erank', 'erank_ratio', 'entropy', 'diag', 'act_std', 'amplification',
    'residual', 'influence', 'lens_loss', 'lens_kl', 'tuned_lens_loss', 'tuned_kl', 'removal_loss', 'f_residual', 'f_influence',
    'f_removal_loss', 'gate_identity_loss', 'gate_grad', 'gate_identity', 'sae_alive', 'sae_l0', 'sae_ev', 'sae_ce_recovered', 'verdict'}, 'CSV')
  eq(require('anatomy.autopsy.compare').Comparison.measures, {'grad_norm', 'erank', 'entropy', 'diag', 'act_std', 'amplification',
    'residual', 'influence', 'lens_loss', 'removal_loss', 'f_residual', 'f_removal_loss', 'gate_identity_loss', 'gate_grad',
    'gate_identity', 'verdict'}, 'compare')
  eq(require('anatomy.autopsy.series').Series.measure_names, {'grad_norm', 'erank', 'entropy', 'act_std', 'amplification', 'residual',
    'influence', 'lens_loss', 'removal_loss', 'f_residual', 'f_removal_loss', 'gate_identity_loss'}, 'series')
  eq(autopsy.all_metrics, {'grad_norm', 'erank', 'attn_entropy', 'act_std', 'residual', 'influence', 'logit_lens', 'removal', 'weight_erank'})
  eq(measures.where('verdict'), {'grad_norm', 'amplification', 'residual', 'removal_loss', 'f_residual', 'f_removal_loss'}, 'verdicts.lua reads')
  -- every measure of the batches phase is on a block's row, and no other key but what the row is and its other phases' measures
  torch.manual_seed(4)
  local m = models.vibenet{vocab = 20, dim = 16, layers = 2, seq = 8, block = 'gate'}
  local a = autopsy.run(m, {torch.randint(1, 21, {4, 8}), torch.randint(1, 21, {4, 8})})
  local row = a.rows[2]
  for _, name in ipairs(measures.where('phase', 'batches')) do
    if name ~= 'entropy' and name ~= 'diag' and not name:find('lens') and name ~= 'tuned_kl' then assert(row[name] ~= nil, name .. ' on the row') end
  end
  local known = {grads = true, class = true, grad_share = true}
  for _, k in ipairs(measures.identity) do known[k] = true end
  for k in pairs(row) do assert(known[k] or measures.by_name[k], ("the row's '%s' is in the registry"):format(k)) end
  for _, mm in ipairs(measures.rows) do assert(type(mm.meaning) == 'string' and mm.phase, mm.name .. ': meaning and phase') end
end)

test('a column the autopsy cannot fill says why, in the table and the JSON', function()
  local corpus = data.from_string(('abcd efgh '):rep(300))
  local Net = nn.block('Net', function(self)
    self.embed = nn.Embedding(corpus.vocab_size, 8, {positions = 8})
    self.blocks = nn.Repeat(2, function() return nn.Residual(nn.Linear(8, 8)) end)
    self.head = nn.Linear(8, corpus.vocab_size)
  end)
  function Net:forward(ids) return self.head(self.blocks(self.embed(ids))) end
  local a = autopsy.run(Net(), corpus, {batch = 2})
  eq(a.rows[2].name, 'blocks.1', 'rows from the blocks container')
  eq(a.missing.lens_loss, 'Net has no readout(h) (the head applied to a hidden state)')
  eq(a.missing.entropy, 'no block publishes an attention pattern (an attention block defines keep_pattern(keep, grad) and pattern())')
  local s = tostring(a)
  assert(s:find('lens_loss: - because Net has no readout(h)', 1, true), s)
  assert(require('anatomy.io.json').encode(a:data()):find('"missing":{', 1, true), 'the JSON says why too')
end)

test("train.fit's probe history and the autopsy's table measure act_std one way (the population std)", function()
  torch.manual_seed(0)
  local m = models.vibenet{vocab = 20, dim = 16, layers = 2, seq = 8}
  local ids = torch.randint(1, 21, {4, 8})
  local cap = probe.capture(m, {filter = {'blocks.*'}}, function() return m(ids) end)
  local record = require('anatomy.autopsy.measure').probe_record(m, 1, {['blocks.1'] = cap['blocks.1']})
  local table_std = torch.metrics.activation_stats(cap['blocks.1']).std
  local n = cap['blocks.1']:numel()
  -- Bessel's correction would make them differ by sqrt(n / (n - 1)), 1 + 1e-3 here
  local rel = math.abs(record.act_std['blocks.1'] - table_std) / table_std
  print(('  %d elements: history %.9g, table %.9g, relative difference %.3g'):format(n, record.act_std['blocks.1'], table_std, rel))
  assert(rel < 1e-6, 'one std convention')
end)

test("autopsy.series over train.fit's kept checkpoints equals autopsy.run at each, and tells the verdict changes", function()
  local dir = H.tmpdir()
  local corpus = data.from_string(string.rep('the quick brown fox jumps over the lazy dog. ', 60))
  local function fresh()
    torch.manual_seed(3)
    return models.gpt{vocab = corpus.vocab_size, dim = 16, layers = 2, heads = 2, seq = 16, ffn = 32}
  end
  train.fit(fresh(), corpus, {steps = 6, batch = 4, lr = 3e-3, quiet = true, checkpoint = dir .. '/run.safetensors',
    checkpoint_every = 2, keep_checkpoints = true})
  eq(fs.list(dir), {'run.safetensors', 'run.step2.safetensors', 'run.step4.safetensors', 'run.step6.safetensors'}, 'kept by step')
  local x, y = corpus:batch(2, 16, {split = 'val'})
  local s = autopsy.series(dir, {model = fresh(), quiet = true}, {x, y}, {steps = 1})
  eq(s.steps, {2, 4, 6}, 'steps from the file names, in order')
  eq(s.labels, {'step2', 'step4', 'step6'}, 'labels')
  for i, step in ipairs{2, 4, 6} do
    local m = fresh()
    train.load_checkpoint(dir .. ('/run.step%d.safetensors'):format(step), m)
    torch.manual_seed(0)
    local a = autopsy.run(m, {x, y}, {steps = 1})
    eq(s.runs[i].loss, a.loss, 'step ' .. step .. ' loss')
    for j, row in ipairs(a.rows) do
      for _, k in ipairs{'grad_norm', 'erank', 'removal_loss', 'act_std'} do
        if row[k] then eq(s.table[k][row.name][i], row[k], ('step %d %s %s'):format(step, row.name, k)) end
      end
      eq(s.verdicts[row.name][i], row.verdict, row.name .. ' verdict')
    end
  end
  -- the story of a layer whose verdict changes, written from a series' verdicts
  s.verdicts['blocks.1'] = {'worker', 'worker', 'passenger'}
  s.steps = {2000, 8000, 16000}
  eq(s:story('blocks.1'), 'blocks.1: worker until step 8000, passenger from step 16000', 'the story')
  s.verdicts['blocks.1'] = {'worker', 'passenger', 'worker'}
  eq(s:story('blocks.1'), 'blocks.1: worker until step 2000, passenger at step 8000, worker from step 16000', 'a passing change')
  s.verdicts['blocks.1'] = {'worker', 'worker', 'worker'}
  eq(s:story('blocks.1'), nil, 'no change, no story')
  raises(function() s:story('blocks.9') end, "s:story: no layer 'blocks.9' in this series")
end)

test('autopsy.series refuses what cannot be a series, before loading anything', function()
  local dir = H.tmpdir()
  local batch = {torch.ones(1, 4):long(), torch.ones(1, 4):long()}
  raises(function() autopsy.series(dir, {}, batch) end, ("autopsy.series: '%s' holds no checkpoints (subfolders with config.json, or train.fit's <name>.step<N>.safetensors)"):format(dir))
  raises(function() autopsy.series(dir, {revisions = {'step1'}}, batch) end, ("autopsy.series: revisions are a Hub repository's; '%s' is a local folder"):format(dir))
  raises(function() autopsy.series('org/name', {}, batch) end, "autopsy.series: a Hub repository needs opts.revisions, a list such as {'step1000', 'step2000'} (hub.list_repo_refs lists them)")
  raises(function() autopsy.series('org/name', {revisions = {'a', 3}}, batch) end, 'autopsy.series: revisions[2] must be a branch, tag or commit name, got 3')
  raises(function() autopsy.series('org/name', {revision = 'a'}, batch) end, "autopsy.series: unknown option 'revision', did you mean 'revisions'? (expected cache_dir, dtype, local_files_only, model, quiet, revisions, seed, steps, token)")
  raises(function() autopsy.series('org/name', {revisions = {'a'}}) end, 'autopsy.series: data (a corpus or {inputs, targets}) is required')
  raises(function() autopsy.series('org/name', {revisions = {'a'}, seed = 0 / 0}, batch) end, 'autopsy.series: seed must be an integer, got nan')
  fs.write_atomic(dir .. '/run.step5.safetensors', 'x')
  raises(function() autopsy.series(dir, {}, batch) end, ("autopsy.series: '%s' holds anatomy checkpoints (run.step5.safetensors); give the model they were trained as opts.model"):format(dir))
end)

test("a pretrained model's autopsy refuses a corpus read with another tokenizer (its ids would be other tokens)", function()
  local folder = H.gpt2_folder()  -- 11 tokens
  local vocab = {}
  for i, ch in ipairs{'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j', 'k'} do vocab[ch] = i - 1 end
  fs.write_atomic(folder .. '/tokenizer.json', json.encode({version = '1.0', added_tokens = {}, normalizer = json.null,
    post_processor = json.null, decoder = {type = 'ByteLevel'},
    pre_tokenizer = {type = 'ByteLevel', add_prefix_space = false, trim_offsets = true, use_regex = true},
    model = {type = 'BPE', dropout = json.null, vocab = vocab, merges = {}}}))
  local model, tok = models.from_pretrained(folder)
  local text = H.tmpfile(('abcdefghijk'):rep(40))
  local chars = data.text(text)
  H.raises(function() autopsy.run(model, chars, {batch = 2, seq = 8}) end,
    ("autopsy.run: the corpus %s was read with a char tokenizer of 11 tokens, and the model reads with its own tokenizer (%s, 11 tokens): "
    .. "its ids would be other tokens; read the text with data.text(path, {tokenizer = model.tokenizer})"):format(text, folder))
  local other = data.tokenizer(folder)
  other.path = 'elsewhere'
  H.raises_part(function() autopsy.run(model, data.text(text, {tokenizer = other}), {batch = 2, seq = 8}) end,
    "was read with the tokenizer of 'elsewhere' (11 tokens)")
  local a = autopsy.run(model, data.text(text, {tokenizer = tok}), {batch = 2, seq = 8})
  assert(a.loss == a.loss, 'read with the model\'s own tokenizer, it runs')
  autopsy.run(model, data.text(text, {tokenizer = data.tokenizer(folder)}), {batch = 2, seq = 8})  -- the same tokenizer read again
end)

test('the per-step metrics read their results back once each, not once a number (a device waits at every read)', function()
  local ws = {torch.randn(16, 8), torch.randn(8, 16), torch.randn(12, 12)}
  local on_device = ws[1].device ~= 'cpu'
  local c, ranks = torch.profiler.count_ops(torch.metrics.eranks, ws)
  eq(#ranks, 3)
  eq(c.syncs, on_device and 1 or 0, 'three effective ranks, one read')
  eq(c.by_name['aten::masked_select'], nil, 'no operator sized by the values')
  local s = torch.profiler.count_ops(torch.metrics.activation_stats, torch.randn(4, 8))
  eq(s.syncs, on_device and 1 or 0, 'mean, std, max and rms: one read')
  -- the same numbers as the definitions: exp of the entropy of the normalised singular values
  local sv = torch.linalg.svdvals(ws[3]:double())
  local p = sv / sv:sum()
  close(ranks[3], math.exp(-(p * p:log()):sum():item()), 1e-9, 'erank of the third')
  close(torch.metrics.eranks({torch.zeros(3, 3)})[1], 0, 0, 'a zero matrix has rank 0')
  -- a step's numbers together: false stands for a missing gradient, output or pattern (NaN)
  local v = torch.metrics.step_values({torch.eye(3)}, {false, torch.ones(4)}, {torch.tensor({1, -3}), false}, {false})
  close(v.eranks, {3}, 1e-12, 'the rank of the identity')
  eq(v.norms[1] ~= v.norms[1], true, 'no gradient: nan')
  close(v.norms[2], 2, 1e-12)
  close({v.stats[1].mean, v.stats[1].std, v.stats[1].max_abs, v.stats[1].rms}, {-1, 2, 3, math.sqrt(5)}, 1e-12, 'stats of {1, -3}')
  eq(v.stats[2].mean ~= v.stats[2].mean, true, 'no output: nan')
  eq(v.entropy[1] ~= v.entropy[1] and v.diag[1] ~= v.diag[1], true, 'no pattern: nan')
  -- unread: nothing comes back (no eigensolver runs) until the reader is called, then all in one copy
  local read
  local unread = torch.profiler.count_ops(function()
    read = torch.metrics.step_values({ws[1], ws[3]}, {false, ws[2]}, {ws[2]}, {false}, false)
  end)
  eq(unread.syncs + (unread.by_name['aten::linalg_eigvalsh'] or 0), 0, 'nothing read or solved before the read')
  local c2, w = torch.profiler.count_ops(read)
  eq(c2.syncs, on_device and 1 or 0, 'the read: one copy')
  close(w.eranks, {torch.metrics.erank(ws[1]), ranks[3]}, 1e-9, 'the unread ranks are the read ones')
  close(w.norms[2], ws[2]:norm():item(), 1e-9)
end)

test("history: train.fit's run or train.read_metrics' records; the header says which tokens the loss is over", function()
  torch.manual_seed(1)
  local c = data.from_string(('abcdefghij'):rep(100), {split = 0.9})
  local m = models.gpt{vocab = c.vocab_size, dim = 16, heads = 2, layers = 2, seq = 16, ffn = 32, norm = 'pre'}
  local path = os.tmpname()
  local run = train.fit(m, c, {steps = 12, batch = 4, seq = 16, quiet = true, log = path, eval_every = 6})
  local from_log = autopsy.run(m, c, {history = train.read_metrics(path), metrics = {'grad_norm'}})
  close(torch.tensor(from_log.history.train, {dtype = 'float64'}), torch.tensor(run.train, {dtype = 'float64'}), 1e-7,
    'the losses of the log are the run\'s (to its 9 digits)')
  eq(#from_log.history.val, 2)
  local html = require('anatomy.autopsy.report').html(from_log)
  assert(html:find('the mean cross-entropy of the next token over 1 random batch of 8 x 16 tokens from the validation split', 1, true), html:sub(1, 400))
  assert(html:find("the training's last val loss", 1, true), 'the val loss is told apart')
  raises(function() autopsy.run(m, c, {history = {1, 2}}) end,
    "autopsy.run: history must be the run train.fit returned (with .train), or train.read_metrics(path)'s records ({step, loss, ...}); "
    .. 'got a table without either')
  os.remove(path)
end)

H.done()
