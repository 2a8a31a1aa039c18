-- The data out: CSV and TensorBoard files of train.fit's log and of the
-- autopsy (lua/anatomy/io/export.lua). TensorBoard's own reader reads them back
-- in tests/parity/test_tensorboard_export.py.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, raises = H.test, H.eq, H.raises
local export = require('anatomy.io.export')
local fs = require('anatomy.io.fs')

local tmpdir = H.tmpdir

test('CSV round-trips numbers exactly, quotes what needs quoting, and leaves missing cells empty', function()
  local d = tmpdir()
  local rows = {{step = 1, loss = 0.1, note = 'a, "quoted"\nline'}, {step = 2, loss = 1 / 3, x = 0 / 0}, {step = 3, loss = -1e-300, x = math.huge}}
  export.csv(d .. '/t.csv', rows, {'step', 'loss', 'x', 'note'})
  eq(fs.read(d .. '/t.csv'):match('^[^\r]*'), 'step,loss,x,note')
  local back, columns = export.read_csv(d .. '/t.csv')
  eq(columns, {'step', 'loss', 'x', 'note'})
  eq(#back, 3)
  eq(back[1].loss, 0.1)
  eq(back[2].loss, 1 / 3)
  eq(back[3].loss, -1e-300)
  eq(back[1].note, 'a, "quoted"\nline')
  eq(back[1].x, nil)
  assert(back[2].x ~= back[2].x, 'nan reads back as nan')
  eq(back[3].x, math.huge)
  raises(function() export.csv(d .. '/u.csv', {1, 2}, {'a'}) end, 'export.csv: row 1 is a number, not a table')
  os.execute('rm -rf ' .. fs.quote(d))
end)

local text = ('it was the best of times, it was the worst of times. '):rep(30)
local function small_run(d)
  local c = data.from_string(text)
  torch.manual_seed(1)
  local m = models.gpt{vocab = c.vocab_size, dim = 16, heads = 2, layers = 2, seq = 16, ffn = 32}
  local run = train.fit(m, c, {steps = 12, batch = 2, seq = 16, seed = 2, quiet = true, eval_every = 4, log = d .. '/log.jsonl'})
  return m, c, run
end

test('train.export_metrics writes the log as CSV that reads back to the same numbers', function()
  local d = tmpdir()
  small_run(d)
  local written = train.export_metrics(d .. '/log.jsonl', {csv = d .. '/log.csv', tensorboard = d .. '/tb'})
  eq(written.csv, d .. '/log.csv')
  assert(written.tensorboard:find(d .. '/tb/events.out.tfevents.', 1, true), written.tensorboard)
  local log = train.read_metrics(d .. '/log.jsonl')
  local rows, columns = export.read_csv(d .. '/log.csv')
  eq(columns, {'step', 'loss', 'lr', 'grad_norm', 'val_loss', 'tokens_per_second', 'time'})
  eq(#rows, 12)
  for i, r in ipairs(rows) do
    for _, k in ipairs(columns) do eq(r[k], log[i][k], ('step %d %s'):format(i, k)) end
  end
  eq(rows[4].val_loss ~= nil and rows[3].val_loss == nil, true, 'val_loss where the run evaluated')
  raises(function() train.export_metrics(d .. '/log.jsonl') end, 'train.export_metrics: say where: {csv = file} and/or {tensorboard = folder}')
  raises(function() train.export_metrics(d .. '/log.jsonl', {cvs = 'x'}) end, "train.export_metrics: unknown option 'cvs' (expected csv, tensorboard)")
  os.execute('rm -rf ' .. fs.quote(d))
end)

test('a:csv has a row a layer with the JSON\'s names; a:tensorboard writes an event file', function()
  local d = tmpdir()
  local m, c, run = small_run(d)
  local a = autopsy.run(m, c, {history = run, batch = 2, seq = 16})
  a:csv(d .. '/autopsy.csv')
  local rows, columns = export.read_csv(d .. '/autopsy.csv')
  eq(columns, {'name', 'kind', 'grad_norm', 'erank', 'erank_ratio', 'entropy', 'diag', 'act_std', 'amplification',
    'residual', 'influence', 'lens_loss', 'lens_kl', 'tuned_lens_loss', 'tuned_kl', 'removal_loss', 'f_residual', 'f_influence', 'f_removal_loss', 'gate_identity_loss', 'gate_grad', 'gate_identity', 'sae_alive', 'sae_l0', 'sae_ev', 'sae_ce_recovered', 'verdict'})
  eq(#rows, #a.rows)
  for i, r in ipairs(a.rows) do
    eq(rows[i].name, r.name)
    for _, k in ipairs{'grad_norm', 'erank', 'entropy', 'act_std', 'lens_loss', 'removal_loss'} do
      eq(rows[i][k], r[k], ('%s %s'):format(r.name, k))
    end
  end
  local path = a:tensorboard(d .. '/tb')
  local bytes = fs.read(path)
  assert(#bytes > 200 and bytes:find('autopsy/grad_norm', 1, true) and bytes:find('train/loss', 1, true), 'the scalars are in the file')
  raises(function() a:csv(3) end, 'a:csv: path must be a file path, got number')
  os.execute('rm -rf ' .. fs.quote(d))
end)

H.done()
