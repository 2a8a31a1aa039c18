-- autopsy.compare: several autopsies side by side (terminal, HTML, JSON),
-- on two small runs that differ in one thing (identity vs gated residual).
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, raises = H.test, H.eq, H.raises

local c = data.from_string(('it was the best of times, it was the worst of times. '):rep(30))
local function one(block)
  torch.manual_seed(1)
  local m = models.vibenet{vocab = c.vocab_size, dim = 16, layers = 3, seq = 16, block = block}
  local run = train.fit(m, c, {steps = 20, batch = 4, seq = 16, seed = 2, quiet = true})
  return autopsy.run(m, c, {history = run, batch = 2, seq = 16})
end
local a, b = one('ffn'), one('gate')

test('the terminal table has a column a run and marks the cells more than 10% from the first run', function()
  local cmp = autopsy.compare({{'ffn', a}, {'gate', b}})
  local text = tostring(cmp)
  assert(text:find('comparison of 2 runs (* differs from ffn by more than 10%)', 1, true), text)
  assert(text:find(('  gate: models.VibeNet, loss %s (%+.1f%%)'):format(autopsy.format(b.loss, 4), 100 * (b.loss / a.loss - 1)), 1, true), text)
  -- each measure's block lists every layer; a cell is starred exactly when it differs by more than 10%
  for _, m in ipairs{'grad_norm', 'erank', 'act_std', 'removal_loss'} do
    local block = text:match('\n' .. m .. ' [^\n]*\n(.-)\n\n') or text:match('\n' .. m .. ' [^\n]*\n(.*)$')
    assert(block, 'a block for ' .. m)
    for line in block:gmatch('[^\n]+') do
      local layer = line:match('^(%S+)')
      local va, vb = cmp:value(1, layer, m), cmp:value(2, layer, m)
      if type(va) == 'number' and type(vb) == 'number' then
        local starred = line:find('%*%s*$') ~= nil
        eq(starred, math.abs(vb - va) / math.max(math.abs(va), math.abs(vb)) > 0.1, ('%s %s: %s'):format(m, layer, line))
      end
    end
  end
end)

test('the report has the overlaid curves with data, each run\'s provenance, and the differing cells highlighted', function()
  local dir = H.tmpdir()
  local cmp = autopsy.compare({a, b}, {labels = {'ffn', 'gate'}})
  local html = H.read(cmp:report(dir .. '/cmp.html'))
  local charts = 0
  for points in html:gmatch('<svg class="chart" data%-kind="lines" data%-points="(%d+)"') do
    charts = charts + 1
    assert(tonumber(points) > 0, 'a curve with data')
  end
  eq(charts, 6, 'the loss, and grad_norm, erank, entropy, act_std, lens_loss by depth')
  local legends = select(2, html:gsub('<text x="%d+" y="%d+">gate</text>', ''))
  eq(legends, 6, 'each curve names the runs in its legend')
  eq(select(2, html:gsub('<dl class="provenance">', '')), 2)
  assert(html:find('<td class="differs">', 1, true), 'differing cells are highlighted')
  os.execute("rm -rf '" .. dir .. "'")
end)

test('runs can come from their JSON files, and the comparison saves as JSON', function()
  local dir = H.tmpdir()
  a:json(dir .. '/ffn.json')
  b:json(dir .. '/gate.json')
  local cmp = autopsy.compare({dir .. '/ffn.json', dir .. '/gate.json'})
  eq(cmp.runs[1].label, 'ffn')
  eq(cmp.runs[2].label, 'gate')
  eq(cmp:value(2, 'blocks.2', 'grad_norm'), b.rows[3].grad_norm)
  local saved = require('anatomy.io.json').decode(H.read(cmp:json(dir .. '/cmp.json')))
  eq(#saved.runs, 2)
  eq(saved.layers, {'embed', 'blocks.1', 'blocks.2', 'blocks.3', 'output'})
  os.execute("rm -rf '" .. dir .. "'")
end)

test('bad input is an error naming what was expected', function()
  raises(function() autopsy.compare({a}) end, 'autopsy.compare: expected a list of at least two autopsies, got 1 item')
  raises(function() autopsy.compare({a, 42}) end, 'autopsy.compare: run 2 must be an autopsy, the path of its JSON, or {label, autopsy}; got number')
  local path = H.tmpfile('{"not": "an autopsy"}')
  raises(function() autopsy.compare({a, path}) end, ("autopsy.compare: run 2: %s is not an autopsy's JSON (a:json writes one)"):format(path))
  raises(function() autopsy.compare({a, b}, {label = {}}) end, "autopsy.compare: unknown option 'label', did you mean 'labels'? (expected labels)")
end)

H.done()
