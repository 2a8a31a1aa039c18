-- The series autopsy over three revisions of org/tiny on the fake Hub, for
-- test_hub.py: each revision's rows must equal a separate autopsy.run of
-- that revision (bit for bit: the same weights, the same batch), the table
-- must hold them, and the report must be written. arg[1]: an output folder.
local fs = require('anatomy.io.fs')
local out = arg[1]
local tok = data.tokenizer('org/tiny')
local ids = tok:encode(('the quick brown fox jumps over the lazy dog. '):rep(4))
local T = math.min(33, ids:size(1))
local batch = {ids:narrow(1, 1, T - 1):unsqueeze(1), ids:narrow(1, 2, T - 1):unsqueeze(1)}
local revisions = {'step0', 'step1', 'step2'}
local s = autopsy.series('org/tiny', {revisions = revisions}, batch, {steps = 1})
print(s)
assert(#s.runs == 3, 'three autopsies')
local largest, compared = 0, 0
for i, r in ipairs(revisions) do
  local model = models.from_pretrained('org/tiny', {revision = r})
  torch.manual_seed(0)
  local a = autopsy.run(model, batch, {steps = 1})
  assert(#a.rows == #s.runs[i].rows, 'the same rows')
  for j, row in ipairs(a.rows) do
    local other = s.runs[i].rows[j]
    assert(row.name == other.name, ('row %d: %s vs %s'):format(j, row.name, other.name))
    assert(row.verdict == other.verdict, ('%s %s: verdict %s vs %s'):format(r, row.name, tostring(row.verdict), tostring(other.verdict)))
    for k, v in pairs(row) do
      if type(v) == 'number' then
        local d = math.abs(v - other[k])
        if d ~= d then error(('%s %s.%s: %s vs %s'):format(r, row.name, k, v, other[k])) end
        largest, compared = math.max(largest, d), compared + 1
        local t = s.table[k] and s.table[k][row.name]
        if t then assert(t[i] == other[k], ('s.table.%s[%s][%d] is not the autopsy\'s'):format(k, row.name, i)) end
      end
    end
  end
  assert(s.runs[i].loss == a.loss, ('%s: loss %s vs %s'):format(r, s.runs[i].loss, a.loss))
  assert(s.origins[i].commit and #s.origins[i].commit == 40, 'the commit of each revision is kept')
  assert(provenance.line(s.runs[i].provenance):find("from org/tiny at " .. r .. " (commit " .. s.origins[i].commit:sub(1, 12) .. ")", 1, true),
    "the provenance names the repository, the revision and the commit")
end
print(('series: %d numbers compared against separate autopsy.run calls, largest difference %g'):format(compared, largest))
assert(largest == 0, 'the series must equal separate runs exactly')
assert(s.steps[1] == 0 and s.steps[3] == 2, 'steps read from the revision names')
local path = s:report(out .. '/series.html')
local html = fs.read(path)
assert(html:find('Verdicts', 1, true) and html:find('erank over training', 1, true), 'the report has its sections')
s:json(out .. '/series.json')
print('series: ok')
-- step3 serves step1's files: the series says so, in its table and its report
local twice = autopsy.series('org/tiny', {revisions = {'step1', 'step3'}, quiet = true}, batch, {steps = 1})
assert(#twice.duplicates == 1 and twice.duplicates[1][1] == 1 and twice.duplicates[1][2] == 2, 'the duplicate is found')
assert(tostring(twice):find('warning: step1 and step3 serve the same weights', 1, true), 'and printed')
assert(twice:html():find('serve the same weights', 1, true), 'and in the report')
assert(#s.duplicates == 0, 'three different revisions are no duplicates')
print('duplicates: ok')
