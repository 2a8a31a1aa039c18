-- Probes and the autopsy: captures, gradients, interventions, verdicts.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require 'harness'
local test, eq, close, raises = H.test, H.eq, H.close, H.raises

local function keys(t)
  local out = {}
  for k in pairs(t) do if k ~= 'grads' then out[#out + 1] = k end end
  table.sort(out)
  return out
end

test('capture records module outputs by dotted name, filtered by globs', function()
  torch.manual_seed(0)
  local m = models.vibenet{vocab = 20, dim = 16, layers = 2, seq = 8}
  local ids = torch.randint(1, 21, {2, 8})
  local cap, logits = probe.capture(m, {filter = {'blocks.*', '*.pattern'}}, function() return m(ids) end)
  -- a glob takes the hook points below too (the RMSNorm's scale, the residual's resid_pre)
  eq(keys(cap), {'blocks.1', 'blocks.1.inner', 'blocks.1.inner.attn', 'blocks.1.inner.attn.pattern', 'blocks.1.inner.attn.scores',
    'blocks.1.inner.attn.z', 'blocks.1.inner.norm', 'blocks.1.inner.norm.normalized', 'blocks.1.inner.norm.scale',
    'blocks.1.resid_post', 'blocks.1.resid_pre', 'blocks.2', 'blocks.2.inner', 'blocks.2.inner.attn', 'blocks.2.inner.attn.pattern',
    'blocks.2.inner.attn.scores', 'blocks.2.inner.attn.z', 'blocks.2.inner.norm', 'blocks.2.inner.norm.normalized',
    'blocks.2.inner.norm.scale', 'blocks.2.resid_post', 'blocks.2.resid_pre'})
  eq(logits:size(), {2, 8, 20}, 'fn results come back')
  -- the recorded values are the real intermediate values
  local x0 = m.embed(ids)
  close(cap['blocks.1.inner.norm'], m.blocks[1].inner.norm(x0), 1e-6)
  close(cap['blocks.1'], x0 + m.blocks[1].inner(x0), 1e-6)
  eq(cap['blocks.2.inner.attn.pattern']:size(), {2, 1, 8, 8})
  eq(cap['blocks.1'].requires_grad, false, 'captures are detached unless grad = true')
  -- after capture, no probe is left: the idle path is back
  for _, mod in m:named_modules() do
    eq(rawget(mod, '_probe'), nil)
    eq(rawget(mod, '_hooks'), nil)
  end
  eq(#probe.names(m), 27, '13 module outputs, and 14 hook points (attention: scores, pattern, z; norm; residual)')
end)

test('grad = true captures activation gradients', function()
  torch.manual_seed(1)
  local m = models.gpt{vocab = 12, dim = 8, heads = 2, layers = 2, seq = 6, ffn = 16}
  local ids, y = torch.randint(1, 13, {2, 6}), torch.randint(1, 13, {2, 6})
  local cap = probe.capture(m, {filter = 'blocks.*', grad = true}, function()
    nn.functional.cross_entropy(m(ids), y):backward()
  end)
  assert(cap.grads['blocks.1'] ~= nil and cap.grads['blocks.2'] ~= nil, 'gradients of both blocks')
  -- the same gradient by hand: d loss / d h2 through ln/head equals what retain_grad gives
  local h1 = m.blocks[1](m.embed(ids))
  local h2 = m.blocks[2](h1)
  h2:retain_grad()
  nn.functional.cross_entropy(m.head(h2), y):backward()
  close(cap.grads['blocks.2'], h2.grad, 1e-6)
  assert(cap.grads['blocks.1.attn.pattern'] ~= nil, 'pattern gradients too')
end)

test('a probe on a Lua-defined block works as on a built-in one', function()
  local Scale = nn.block('Scale', function(self, dim) self.w = nn.Parameter(torch.ones(dim) * 2) end)
  function Scale:forward(x) return x * self.w end
  local m = nn.Sequential{nn.Linear(4, 4), Scale(4), nn.Linear(4, 2)}
  local x = torch.randn(3, 4)
  local cap = probe.capture(m, {grad = true}, function() m(x):sum():backward() end)
  close(cap['2'], m[1](x) * 2, 1e-6)
  close(cap.grads['2'], torch.ones(3, 2):matmul(m[3].weight), 1e-6)
  local h = probe.replace(m, '2', function(a) return a * 0 end)
  close(m(x), m[3].bias:expand(3, 2), 1e-6, 'zeroing the Lua block leaves the last bias')
  h:remove()
  eq(rawget(m[2], '_probe'), nil)
end)

test('skipping every block of a residual model gives the embedding-to-head logits', function()
  torch.manual_seed(2)
  local m = models.vibenet{vocab = 20, dim = 16, layers = 3, seq = 8, block = 'ffn'}
  local ids = torch.randint(1, 21, {2, 8})
  local full = m(ids)
  local handles = {}
  for i = 1, 3 do handles[i] = probe.skip(m, 'blocks.' .. i) end
  close(m(ids), m.head(m.act(m.expand(m.embed(ids)))), 1e-6)
  probe.clear(m)
  close(m(ids), full, 0, 'clear restores the model')
end)

test('zero-ablation changes the loss; patching a run into itself does not', function()
  torch.manual_seed(3)
  local m = models.gpt{vocab = 12, dim = 8, heads = 2, layers = 2, seq = 6, ffn = 16}
  local ids, y = torch.randint(1, 13, {2, 6}), torch.randint(1, 13, {2, 6})
  local function loss() return nn.functional.cross_entropy(m(ids), y):item() end
  local base = loss()
  local cap = probe.capture(m, {filter = 'blocks.1.attn'}, function() m(ids) end)
  local h = probe.replace(m, 'blocks.1.attn', function(a) return torch.zeros_like(a) end)
  assert(math.abs(loss() - base) > 1e-4, 'zero-ablation changes the loss')
  h:remove()
  h = probe.replace(m, 'blocks.1.attn', function() return cap['blocks.1.attn'] end)
  close(loss(), base, 1e-6, 'patching in the same activation changes nothing')
  h:remove()
  raises(function() probe.skip(m, 'blocks.9') end, "no module or hook point named 'blocks.9' in models.GPT (modules: embed, blocks, blocks.1, blocks.1.attn, "
    .. "blocks.1.ln1, blocks.1.mlp, blocks.1.ln2, blocks.2, blocks.2.attn, blocks.2.ln1, blocks.2.mlp, blocks.2.ln2, ...; a block's hook points: probe.names(model))")
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

test('batched ranks and norms agree with the one-at-a-time kernels', function()
  torch.manual_seed(3)
  local ws = {torch.randn(12, 7), torch.randn(7, 12), torch.randn(12, 7), torch.randn(5, 5):mul(0), torch.randn(9, 9)}
  local r = torch.metrics.eranks(ws)
  for i, w in ipairs(ws) do
    local want = torch.metrics.erank(w)
    assert(math.abs(r[i] - want) <= 1e-9 * math.max(want, 1), ('erank %d: %g vs %g'):format(i, r[i], want))
  end
  eq(r[4], 0, 'an all-zero matrix has rank 0')
  local n = torch.metrics.norms({ws[1], false, ws[5]})
  close(n[1], ws[1]:norm():item(), 1e-5)
  eq(n[2] ~= n[2], true, 'a missing tensor gives nan')
  close(n[3], ws[5]:norm():item(), 1e-5)
  raises(function() torch.metrics.eranks({torch.randn(3)}) end, "bad argument #1 to 'metrics.eranks' (effective_ranks: matrix 1 is not 2-D)")
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
  raises(function() a:plot('nonsense') end, "test_probe.lua:194: bad argument #1 to 'plot' (unknown column 'nonsense'; the columns are grad_norm, erank, entropy, diag, "
    .. "act_std, act_mean, act_max, act_rms, amplification, residual, influence, lens_loss, lens_agree, removal_loss, f_residual, f_influence, f_removal_loss, gate_identity_loss, gate_grad, gate_identity)")
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

H.done()
