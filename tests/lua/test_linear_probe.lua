-- probe.linear: a probe per layer reads what the layer holds (a layer made
-- to hold the previous token: at chance before it, near 1 after), control
-- tasks and selectivity, real-valued labels, one label per example on
-- padded batches, a seeded split that leaves the session's generators
-- alone, and the errors of bad labels and options.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, close, raises = H.test, H.eq, H.close, H.raises

local V, B, T = 12, 48, 16
torch.manual_seed(3)
local model = models.gpt{vocab = V, dim = 32, heads = 4, layers = 2, seq = T, ffn = 64, norm = 'pre'}
model:eval()
local ids = torch.randint(1, V + 1, {B, T})
-- the previous token at every position but the first
local prev = torch.ones(B, T, {dtype = 'int64'})
prev:narrow(2, 2, T - 1):copy_(ids:narrow(2, 1, T - 1))
local from_second = torch.ones(B, T, {dtype = 'bool'})
from_second:narrow(2, 1, 1):fill_(false)

-- blocks.1's output shifted one position on: it then holds the previous token (its own stream's
-- copy of it), which the embedding (blocks.1.resid_pre) does not
local function shifted(m)
  return probe.replace(m, 'blocks.1.resid_post', function(t)
    local out = torch.zeros_like(t)
    out:narrow(2, 2, T - 1):copy_(t:narrow(2, 1, T - 1))
    return out
  end)
end

test('a probe for the previous token: at chance on the embedding, near 1 on a layer that holds it', function()
  local h = shifted(model)
  local p = probe.linear(model, ids, prev, {mask = from_second, control = true, steps = 200, lr = 0.05})
  h:remove()
  eq(#p.rows, 3)
  eq(p.rows[1].name, 'embed')
  eq(p.rows[1].point, 'blocks.1.resid_pre')
  eq(p.rows[2].point, 'blocks.1.resid_post')
  local chance = p.rows[1].chance
  if not (p.rows[1].test_acc < chance + 0.1) then error(('embed: %.3f, chance %.3f'):format(p.rows[1].test_acc, chance)) end
  if not (p.rows[2].test_acc >= 0.95) then error(('blocks.1: %.3f'):format(p.rows[2].test_acc)) end
  -- the control task (a label per current token type) is what the embedding can memorise; the shifted layer cannot
  if not (p.rows[1].control_acc > 0.9) then error(('embed control: %.3f'):format(p.rows[1].control_acc)) end
  if not (p.rows[2].selectivity > 0.5 and p.rows[1].selectivity < 0) then
    error(('selectivity: embed %.3f, blocks.1 %.3f'):format(p.rows[1].selectivity, p.rows[2].selectivity))
  end
  eq(p.n_train + p.n_test, B * (T - 1))
  local s = tostring(p)
  if not s:find('selectivity', 1, true) then error(s) end
  if not p:svg():find('chance', 1, true) then error('no chance line in the chart') end
end)

test('the split is by whole examples, seeded, and leaves the session\'s generators alone', function()
  torch.manual_seed(9)
  local before = {math.random(), torch.rand(1):item()}
  torch.manual_seed(9)
  local a = probe.linear(model, ids, prev, {mask = from_second, layers = {0}, steps = 20, seed = 5})
  eq({math.random(), torch.rand(1):item()}, before, 'the next random numbers')
  local b = probe.linear(model, ids, prev, {mask = from_second, layers = {0}, steps = 20, seed = 5})
  local c = probe.linear(model, ids, prev, {mask = from_second, layers = {0}, steps = 20, seed = 6})
  eq(a.rows[1].train_loss, b.rows[1].train_loss, 'same seed')
  H.identical(a.weights[1].weight, b.weights[1].weight, 'same seed')
  if a.rows[1].train_loss == c.rows[1].train_loss then error('seeds 5 and 6 split alike') end
  eq(a.n_train, math.floor(0.8 * B + 0.5) * (T - 1), 'whole examples: 15 labelled positions each')
end)

test('real-valued labels: a linear function of the embedding is read with R^2 near 1', function()
  local _, cache = probe.run_with_cache(model, ids, {filter = 'blocks.1.resid_pre'})
  local emb = cache['blocks.1.resid_pre']
  torch.manual_seed(1)
  local w = torch.randn(32)
  local y = emb:matmul(w) * 3 + 10
  local p = probe.linear(model, ids, y, {layers = {0}, steps = 300, lr = 0.05})
  eq(p.classes, false)
  if not (p.rows[1].test_r2 > 0.99) then error(('R^2 %.4f'):format(p.rows[1].test_r2)) end
  raises(function() probe.linear(model, ids, y, {control = true}) end, 'probe.linear: control tasks need class labels (int64), not values')
end)

test('one label per example, read at a position among its real tokens, on a batch padded on the left', function()
  local rows, last = {}, {}
  torch.manual_seed(4)
  for i = 1, 20 do
    local n = 3 + (i % 5)
    rows[i] = torch.randint(1, V + 1, {n})
    last[i] = rows[i][n]:item()
  end
  local p = probe.linear(model, rows, torch.tensor(last, {dtype = 'int64'}), {layers = {0}, padding_side = 'left', steps = 200, lr = 0.05})
  if not (p.rows[1].train_acc == 1) then error(('the last token from the embedding: %.3f'):format(p.rows[1].train_acc)) end
  eq(p.n_train + p.n_test, 20)
  local first = {}
  for i = 1, 20 do first[i] = rows[i][1]:item() end
  local q = probe.linear(model, rows, torch.tensor(first, {dtype = 'int64'}), {layers = {0}, position = 1, padding_side = 'left', steps = 200, lr = 0.05})
  if not (q.rows[1].train_acc == 1) then error(('the first real token (left padding): %.3f'):format(q.rows[1].train_acc)) end
end)

test('bad labels and options are errors that say what is wrong', function()
  raises(function() probe.linear(model, ids, prev:narrow(2, 1, 5)) end,
    'probe.linear: labels must be (B, T) = 48x16 as the ids, or (B), got 48x5')
  raises(function() probe.linear(model, ids, prev:narrow(1, 1, 5):narrow(2, 1, 1):squeeze(2)) end,
    'probe.linear: labels (B) must have one per example: 48 examples, 5 labels')
  raises(function() probe.linear(model, ids, prev - 1) end, 'probe.linear: class labels must be 1 or more, got 0 (leave positions out with mask)')
  raises(function() probe.linear(model, ids, torch.full({B, T}, 0 / 0)) end, 'probe.linear: labels hold NaN or infinite values at labelled positions')
  raises(function() probe.linear(model, ids, prev, {mask = from_second:narrow(2, 1, 3)}) end,
    'probe.linear: mask must be a (B, T) = 48x16 bool Tensor, got bool 48x3')
  raises(function() probe.linear(model, ids, prev, {split = 1.5}) end, 'probe.linear: split must be a number in (0, 1], got 1.5')
  raises(function() probe.linear(model, ids, prev, {layers = {3}}) end, 'probe.linear: layer must be in 0..2 (0: the embedding), got 3')
  raises(function() probe.linear(model, ids, prev, {point = 'attn.z', layers = {0}}) end, 'probe.linear: layer must be in 1..2, got 0')
  H.raises_part(function() probe.linear(model, ids, prev, {point = 'nonsense'}) end, "probe.linear: blocks.1 has no 'nonsense' (no hook point")
  raises(function() probe.linear(model, ids, prev, {stpes = 3}) end,
    "probe.linear: unknown option 'stpes' (expected control, layers, lr, mask, padding_side, point, position, seed, split, steps, tokenizer, weight_decay)")
  raises(function() probe.linear(model, ids, torch.ones(B, T, {dtype = 'int64'})) end, 'probe.linear: the labels hold one class only (1): nothing to tell apart')
  raises(function() probe.linear(model, ids:narrow(1, 1, 1), prev:narrow(1, 1, 1)) end,
    'probe.linear: the examples are split into train and test: give 2 or more, got 1')
  raises(function() probe.linear(model, ids, prev, {control = 'yes'}) end, 'probe.linear: control must be true or false, got yes')
  raises(function() probe.linear(model, ids, 'labels') end, 'probe.linear: labels must be a Tensor, got string')
end)

H.done()
