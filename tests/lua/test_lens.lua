-- The logit lens and the tuned lens: what each reads (the last layer is the
-- model's own output), that training lowers the KL at every layer but the
-- last with the model untouched, reproducibility with a seed, saving and
-- loading with the model's weights hash, the autopsy's lens columns against
-- an independent computation, and the errors of bad options and files.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, close, raises, raises_part = H.test, H.eq, H.close, H.raises, H.raises_part

local corpus = data.from_string(string.rep('the quick brown fox jumps over the lazy dog; a lazy cat naps in the sun. ', 120))
local function trained_gpt()
  torch.manual_seed(1)
  local m = models.gpt{vocab = corpus.vocab_size, dim = 32, heads = 4, layers = 3, seq = 32, ffn = 64, norm = 'pre'}
  train.fit(m, corpus, {steps = 40, batch = 8, seq = 32, quiet = true, seed = 1})
  m:eval()
  return m
end
local model = trained_gpt()
local text = 'the lazy dog naps in'

-- KL(p || q) per position from logits, written out here
local function kl_rows(p_logits, q_logits)
  local lp, lq = p_logits:log_softmax(-1):double(), q_logits:log_softmax(-1):double()
  return (lp:exp() * (lp - lq)):sum(-1)
end

-- every row's residual stream: the first block's input, then each block's output
local function residuals(m, ids)
  local names = {'blocks.1.resid_pre'}
  for i = 1, #m:layers() do names[#names + 1] = ('blocks.%d'):format(i) end
  local logits, cache = probe.run_with_cache(m, ids, {filter = names})
  local h = {[0] = cache['blocks.1.resid_pre']}
  for i = 1, #m:layers() do h[i] = cache[('blocks.%d'):format(i)] end
  return h, logits
end

test('the logit lens reads each row through the model\'s readout; the last row is the model\'s output (KL 0)', function()
  local l = lens.logit(model)
  eq(l.names, {'embed', 'blocks.1', 'blocks.2', 'blocks.3'})
  local ids = corpus:encode(text):unsqueeze(1)
  local h, logits = residuals(model, ids)
  local e = l:evaluate(ids)
  local T = ids:size(2)
  for i = 0, 3 do
    local read = torch.no_grad(function() return model:readout(h[i]) end)
    close(e.kl[i + 1], kl_rows(logits, read):mean():item(), 1e-6, 'kl of ' .. l.names[i + 1])
    local ce = nn.functional.cross_entropy(read:narrow(2, 1, T - 1), ids:narrow(2, 2, T - 1):to(read.device)):item()
    close(e.loss[i + 1], ce, 1e-6, 'loss of ' .. l.names[i + 1])
  end
  close(e.kl[4], 0, 1e-6, 'the last row')
  local own = nn.functional.cross_entropy(logits:narrow(2, 1, T - 1), ids:narrow(2, 2, T - 1):to(logits.device)):item()
  close(e.loss[4], own, 1e-6, 'the last row\'s loss is the model\'s')
end)

test('every pretrained family and the built-in GPT have a logit lens whose last row is the output', function()
  for _, entry in ipairs(H.family_models(40, 3)) do
    local name, m = entry[1], entry[2]
    m:eval()
    local ids = torch.randint(1, 41, {2, 7})
    local e = lens.logit(m):evaluate(ids)
    eq(#e.kl, #m:layers() + 1, name)
    close(e.kl[#e.kl], 0, 1e-5, name .. ': the last row')
    for i, v in ipairs(e.kl) do if not (v == v and v >= -1e-6) then error(('%s row %d: KL %s'):format(name, i, tostring(v))) end end
  end
end)

local tuned = lens.tuned(model, corpus, {steps = 60, batch = 8, seq = 32, lr = 3e-3, seed = 7, quiet = true})

test('the tuned lens lowers the KL to the final distribution at every row but the last, on held-out text', function()
  local ids = corpus:encode(text):unsqueeze(1)
  local logit, t = lens.logit(model):evaluate(ids), tuned:evaluate(ids)
  for i = 1, #t.kl - 1 do
    if not (t.kl[i] < logit.kl[i]) then
      error(('%s: tuned KL %.4f, logit KL %.4f'):format(t.layers[i], t.kl[i], logit.kl[i]))
    end
  end
  close(t.kl[#t.kl], 0, 1e-6, 'the last row has no translator')
  eq(#tuned.history, 60)
  if not (tuned.history[60] < tuned.history[1]) then error(('training KL %.4f -> %.4f'):format(tuned.history[1], tuned.history[60])) end
end)

test('training leaves the model as it was: weights, gradients, requires_grad and mode', function()
  local m = trained_gpt()
  local before, grads = {}, {}
  for name, p in m:named_parameters() do before[name], grads[name] = p:clone(), p.grad ~= nil and p.grad:clone() or nil end
  m:train()
  lens.tuned(m, corpus, {steps = 3, seq = 16, quiet = true})
  eq(m.training, true, 'training mode restored')
  for name, p in m:named_parameters() do
    H.identical(p, before[name], name)
    eq(p.requires_grad, true, name .. ' requires_grad')
    if grads[name] then H.identical(p.grad, grads[name], name .. '.grad')
    elseif p.grad ~= nil then error(name .. ' has a gradient from the lens') end
  end
end)

test('training is reproducible with a seed and differs with another', function()
  local a = lens.tuned(model, corpus, {steps = 5, seq = 16, seed = 3, quiet = true})
  local b = lens.tuned(model, corpus, {steps = 5, seq = 16, seed = 3, quiet = true})
  local c = lens.tuned(model, corpus, {steps = 5, seq = 16, seed = 4, quiet = true})
  for i = 0, 2 do
    H.identical(a.translators[i].weight, b.translators[i].weight, 'seed 3, row ' .. i)
    H.identical(a.translators[i].bias, b.translators[i].bias, 'seed 3, row ' .. i)
  end
  if (a.translators[0].weight - c.translators[0].weight):abs():max():item() == 0 then error('seeds 3 and 4 trained the same translators') end
end)

test('save and load: the same translators; another model\'s weights, another file or other rows are errors', function()
  local dir = H.tmpdir()
  local path = tuned:save(dir .. '/lens.safetensors')
  local back = lens.load(model, path)
  for i = 0, 2 do H.identical(back.translators[i].weight, tuned.translators[i].weight, 'row ' .. i) end
  local ids = corpus:encode(text):unsqueeze(1)
  eq(back:evaluate(ids).kl, tuned:evaluate(ids).kl)
  eq(back.config.steps, 60)
  local other = trained_gpt()
  local moved
  for name, p in other:named_parameters() do if name == 'blocks.2.mlp.proj.weight' then moved = p end end
  torch.no_grad(function() moved:add_(1e-3) end)
  raises_part(function() lens.load(other, path) end, 'was trained on models.GPT with weights sha256 ')
  local deeper = models.gpt{vocab = corpus.vocab_size, dim = 32, heads = 4, layers = 2, seq = 32, ffn = 64, norm = 'pre'}
  raises_part(function() lens.load(deeper, path) end, "was trained on rows embed,blocks.1,blocks.2,blocks.3; this model's are embed,blocks.1,blocks.2")
  local plain = dir .. '/plain.safetensors'
  model:save(plain)
  raises_part(function() lens.load(model, plain) end, "is not a lens saved by lens:save (its metadata format is anatomy)")
  raises_part(function() lens.load(model, dir .. '/missing.safetensors') end, 'lens.load: ')
  raises(function() lens.logit(model):save(dir .. '/x.safetensors') end, 'lens:save: a logit lens has nothing to save (no translators)')
end)

test('the weights hash changes with any one weight and not between equal models', function()
  -- the hash covers every value: one weight moved by 1e-6 changes it
  local m = trained_gpt()
  local h1 = lens.weights_sha256(m)
  for name, p in m:named_parameters() do
    if name == 'head.weight' then torch.no_grad(function() p[1][1]:add_(1e-6) end) end
  end
  if lens.weights_sha256(m) == h1 then error('the weights hash did not change with the weights') end
  eq(lens.weights_sha256(trained_gpt()), h1, 'the same weights hash alike')
end)

test('from_translators: given translators are read as h + h W^T + b; bad ones are errors', function()
  torch.manual_seed(2)
  local tr = {}
  for i = 0, 2 do tr[i] = {weight = torch.randn(32, 32) * 0.1, bias = torch.randn(32) * 0.1} end
  local l = lens.from_translators(model, tr)
  local ids = corpus:encode(text):unsqueeze(1)
  local h, logits = residuals(model, ids)
  local e = l:evaluate(ids)
  for i = 0, 2 do
    local x = h[i] + h[i]:matmul(tr[i].weight:t()) + tr[i].bias
    local read = torch.no_grad(function() return model:readout(x) end)
    close(e.kl[i + 1], kl_rows(logits, read):mean():item(), 1e-6, 'row ' .. i)
  end
  raises(function() lens.from_translators(model, {[0] = tr[0], tr[1]}) end,
    'lens.from_translators: translators[2] (blocks.2) must be {weight = Tensor, bias = Tensor}, got nil')
  raises(function() lens.from_translators(model, {[0] = tr[0], tr[1], {weight = torch.zeros(32, 16), bias = torch.zeros(32)}}) end,
    'lens.from_translators: translators[2] (blocks.2) must be a (32, 32) weight and a (32) bias, got 32x16 and 32')
  raises(function() lens.from_translators(model, {[0] = tr[0], tr[1], tr[2], tr[2]}) end,
    "lens.from_translators: translators[3] is the last layer (blocks.3), whose readout is the model's output: it has no translator")
  raises(function() lens.from_translators(model, {[0] = tr[0], tr[1], {weight = torch.full({32, 32}, 0 / 0), bias = torch.zeros(32)}}) end,
    'lens.from_translators: translators[2] (blocks.2) holds NaN or infinite values')
end)

test('options are checked when given', function()
  raises(function() lens.tuned(model, corpus, {steps = 0}) end, 'lens.tuned: steps must be a whole number >= 1, got 0')
  raises(function() lens.tuned(model, corpus, {lr = 0 / 0}) end, 'lens.tuned: lr must be a positive number, got nan')
  raises(function() lens.tuned(model, corpus, {seq = 64}) end, "lens.tuned: seq 64 is longer than the model's context (32)")
  raises(function() lens.tuned(model, corpus, {stpes = 3}) end,
    "lens.tuned: unknown option 'stpes' (expected batch, log_every, lr, quiet, seed, seq, split, steps, weight_decay)")
  raises(function() lens.tuned(model, 'corpus') end, 'lens.tuned: corpus must be a data corpus (data.text), got string')
  raises(function() lens.tuned(model, corpus, {split = 'test'}) end, "lens.tuned: split must be 'train' or 'val', got test")
  raises(function() lens.logit({}) end, 'lens.logit: model must be an nn.Module, got table')
  raises(function() tuned:readout(4, torch.zeros(1, 1, 32)) end, 'lens:readout: layer must be 0 (embed) .. 3, got 4')
  raises(function() tuned:readout(1, torch.zeros(1, 1, 16)) end, 'lens:readout: h has 16 features, the translator of blocks.1 32')
  raises(function() tuned:table(text, {tokenizer = corpus, k = 0}) end, 'lens:table: k must be a whole number >= 1, got 0')
  raises(function() tuned:evaluate(corpus:encode('t')) end, 'lens:evaluate: the input needs 2 tokens or more (a next token to predict)')
  raises(function() tuned:trajectory({'the', 'a lazy'}, {tokenizer = corpus}) end, 'lens:trajectory: one text (or one row of ids), got 2')
  -- an input error names the caller's line, not the library's
  for _, call in ipairs{function() tuned:trajectory('the lazy') end, function() tuned:evaluate('the lazy') end} do
    local ok, err = pcall(call)
    if ok or not tostring(err):find('^[^\n]*test_lens%.lua:%d+: lens:%a+: a text needs a tokenizer') then error('wrong position: ' .. tostring(err)) end
  end
end)

test('trajectory and table: the last row agrees with the model (rank 1, KL 0); entropy and top tokens as computed here', function()
  local ids = corpus:encode(text):unsqueeze(1)
  local t = tuned:trajectory(text, {tokenizer = corpus})
  local T = ids:size(2)
  eq(#t.kl, 4)
  eq(#t.kl[1], T)
  eq(t.tokens[1], 't')
  local h, logits = residuals(model, ids)
  local read = torch.no_grad(function() return tuned:readout(1, h[1]) end)[1]
  local lp = read:log_softmax(-1):double()
  for p = 1, T do
    eq(t.rank[4][p], 1, 'last row, position ' .. p)
    close(t.kl[4][p], 0, 1e-6, 'last row, position ' .. p)
    close(t.entropy[2][p], -(lp[p]:exp() * lp[p]):sum():item(), 1e-5, 'entropy of blocks.1 at ' .. p)
  end
  local tab = tuned:table(text, {tokenizer = corpus, k = 3})
  local top = logits[1]:argmax(-1):tolist()
  for p = 1, T do
    eq(tab.top[4][p][1][1], corpus:decode({top[p]}), 'the last row\'s top token at ' .. p)
    eq(#tab.top[1][p], 3)
  end
  local s = tostring(tab)
  if not s:find('position 1, input t', 1, true) then error(s) end
  local svg = tab:svg()
  if not svg:find('data-kind="heatmap"', 1, true) or not svg:find('class="cell"', 1, true) then error('no cell labels in the chart') end
  local shared = tab:svg{range = {0, 100}}  -- one scale for two tables: every small KL near the low end's colour
  if shared == svg then error('range did not change the colours') end
  raises(function() tab:svg{range = {1, 0}} end, 'table:svg: range must be {low, high} with low < high')
  if not tostring(t):find('rank of the final top token', 1, true) then error(tostring(t)) end
end)

test('a padded batch: evaluate weighs each example by its real positions', function()
  local texts = {'the lazy dog naps', 'a cat', 'over the quick brown fox'}
  local e = tuned:evaluate(texts, {tokenizer = corpus})
  local kl_sum, loss_sum, n, m = {}, {}, 0, 0
  for _, s in ipairs(texts) do
    local ids = corpus:encode(s)
    local one = tuned:evaluate(ids)
    for i = 1, #one.kl do
      kl_sum[i] = (kl_sum[i] or 0) + one.kl[i] * ids:numel()
      loss_sum[i] = (loss_sum[i] or 0) + one.loss[i] * (ids:numel() - 1)
    end
    n, m = n + ids:numel(), m + ids:numel() - 1
  end
  for i = 1, #e.kl do
    close(e.kl[i], kl_sum[i] / n, 1e-5, 'kl of ' .. e.layers[i])
    close(e.loss[i], loss_sum[i] / m, 1e-5, 'loss of ' .. e.layers[i])
  end
end)

test('the autopsy with {lens = l}: lens_kl, tuned_lens_loss and tuned_kl equal the lens read here', function()
  local x, y = corpus:batch(4, 32, {split = 'val'})
  local a = autopsy.run(model, {x, y}, {lens = tuned, metrics = {'logit_lens'}})
  local h, logits = residuals(model, x)
  local final = logits
  for i = 1, 3 do
    local row = a.rows[i + 1]
    eq(row.name, 'blocks.' .. i)
    local t = torch.no_grad(function() return tuned:readout(i, h[i]) end)
    local plain = torch.no_grad(function() return model:readout(h[i]) end)
    close(row.tuned_lens_loss, nn.functional.cross_entropy(t, y):item(), 1e-5, row.name .. ' tuned_lens_loss')
    close(row.tuned_kl, kl_rows(final, t):mean():item(), 1e-5, row.name .. ' tuned_kl')
    close(row.lens_kl, kl_rows(final, plain):mean():item(), 1e-5, row.name .. ' lens_kl')
  end
  close(a.rows[4].tuned_kl, 0, 1e-6, 'the last layer')
  local s = tostring(a)
  if not s:find('tuned_lens_loss', 1, true) then error('no tuned_lens_loss column in the table') end
  local html = require('anatomy.autopsy.report').html(a)
  if not html:find('logit lens and tuned lens', 1, true) then error('no lens chart in the report') end
  local plain_a = autopsy.run(model, {x, y}, {metrics = {'logit_lens'}})
  if tostring(plain_a):find('tuned_kl', 1, true) then error('a tuned_kl column without a lens') end
  raises(function() autopsy.run(model, {x, y}, {lens = lens.logit(model)}) end,
    'autopsy.run: lens is a logit lens, which the autopsy reads already (lens_loss); pass a tuned lens (lens.tuned, lens.load)')
  raises(function() autopsy.run(trained_gpt(), {x, y}, {lens = tuned}) end, 'autopsy.run: lens was made for another model (models.GPT), not this models.GPT')
  raises(function() autopsy.run(model, {x, y}, {lens = 'tuned'}) end, 'autopsy.run: lens must be a lens from lens.tuned or lens.load, got string')
end)

H.done()
