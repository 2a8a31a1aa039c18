-- Results: an experiment's claims beside our measurements, with a verdict per
-- row, the runs that produced them and their provenance record. Saved as
-- results.json (the data) and results.md (the table); scripts/results
-- collects every example's into examples/RESULTS.md.
local autopsy = require('anatomy.autopsy')
local json = require('anatomy.io.json')
local provenance = require('anatomy.io.provenance')
local provenance_text = require('anatomy.render.provenance')
local fs = require('anatomy.io.fs')

local Results = {}
Results.__index = Results

-- Results.new(title, data, smoke) -> results; data as experiment.corpus
-- returns it (or nil: no dataset check); smoke: a smoke run (a few steps, to
-- test the script), whose verdicts mean nothing and say so.
function Results.new(title, data, smoke)
  return setmetatable({title = title, data = data, smoke = smoke == true, rows = {}, runs = {}, notes = {}, sweeps = {}}, Results)
end

local function text_of(v)
  if type(v) == 'number' then return autopsy.format(v) end
  return tostring(v)
end

-- The verdict a row gets: the rule's own, or 'not comparable (data: NAME)'
-- when the experiment did not run on the text its claims were made on.
function Results:verdict_for(verdict)
  local other = self.data and not self.data.comparable and ('not comparable (data: %s)'):format(self.data.name)
  if self.smoke then return 'smoke run: not meaningful' .. (other and ('; ' .. other) or '') end
  return other or verdict
end

-- Whether a value, or a text made from values, holds a NaN ('nan', '-nan').
local function has_nan(v)
  if type(v) == 'number' then return v ~= v end
  return type(v) == 'string' and v:lower():find('%f[%w]nan%f[%W]') ~= nil
end

-- results:add(claim, published, ours, verdict). A NaN among them makes the
-- verdict 'not meaningful (nan)', whatever the rule said (every comparison
-- with NaN is false, so a rule's answer about one means nothing).
function Results:add(claim, published, ours, verdict)
  if has_nan(ours) or has_nan(published) or has_nan(claim) then verdict = 'not meaningful (nan)' end
  self.rows[#self.rows + 1] = {claim = claim, published = tostring(published), ours = text_of(ours),
    value = type(ours) == 'number' and ours == ours and ours or nil, verdict = self:verdict_for(verdict)}
end

-- results:run(label, model, run[, corpus]): records a trained model for the provenance record
function Results:run(label, model, run, corpus)
  self.runs[#self.runs + 1] = {label = label, model = model, run = run}
  if corpus then self.corpus_ = corpus end
end

-- results:note(text): a sentence printed under the table (settings, what was measured how)
function Results:note(text) self.notes[#self.notes + 1] = text end

-- results:sweep(title, sweep): a sweep's table (and charts) saved with the results
function Results:sweep(title, sweep) self.sweeps[#self.sweeps + 1] = {title = title, sweep = sweep} end

-- Results.markdown_table(header, rows) -> a Markdown table, each column padded to its widest cell
local function markdown_table(header, rows)
  local widths = {}
  for c = 1, #header do
    widths[c] = #header[c]
    for _, r in ipairs(rows) do widths[c] = math.max(widths[c], #r[c]) end
  end
  local function line(r)
    local parts = {}
    for c = 1, #header do parts[c] = r[c] .. (' '):rep(widths[c] - #r[c]) end
    return '| ' .. table.concat(parts, ' | ') .. ' |'
  end
  local seps = {}
  for c = 1, #header do seps[c] = ('-'):rep(widths[c]) end
  local out = {line(header), '|-' .. table.concat(seps, '-|-') .. '-|'}
  for _, r in ipairs(rows) do out[#out + 1] = line(r) end
  return table.concat(out, '\n')
end
Results.markdown_table = markdown_table

-- results:table_text() -> the claims table (claim, published, ours, verdict) as Markdown
function Results:table_text()
  local rows = {}
  for i, r in ipairs(self.rows) do rows[i] = {r.claim, r.published, r.ours, r.verdict} end
  return markdown_table({'claim', 'published', 'ours', 'verdict'}, rows)
end

function Results:__tostring()
  local out = {'### ' .. self.title, '', self:table_text()}
  for _, n in ipairs(self.notes) do out[#out + 1] = '\n' .. n end
  for _, s in ipairs(self.sweeps) do out[#out + 1] = '\n#### ' .. s.title .. '\n\n' .. s.sweep:markdown() end
  return table.concat(out, '\n')
end

-- results:provenance(corpus, config) -> the provenance record of these results
function Results:provenance(corpus, config)
  local runs = {}
  for i, r in ipairs(self.runs) do runs[i] = r end
  return provenance.record{corpus = corpus or self.corpus_, runs = runs, config = config}
end

-- The data's description as results.json keeps it: the file's name, not
-- where it lay on the machine that ran the experiment (the provenance
-- record names files the same way).
local function published_data(d)
  if type(d) ~= 'table' then return d end
  local out = {}
  for k, v in pairs(d) do if k ~= 'path' then out[k] = v end end
  if type(d.note) == 'string' and type(d.path) == 'string' and d.path ~= '' then
    local at = d.note:find(d.path, 1, true)
    if at then out.note = d.note:sub(1, at - 1) .. (d.name or '') .. d.note:sub(at + #d.path) end
  end
  return out
end

-- results:save(dir, {corpus, config, name}) -> the paths of results.json and
-- results.md in dir: rows, notes, sweeps and the provenance record. Each
-- sweep's charts go beside them as SVG files.
function Results:save(dir, opts)
  opts = opts or {}
  fs.mkdir(dir)
  local rec = self:provenance(opts.corpus, opts.config)
  local name = opts.name or (arg and arg[0] and arg[0]:match('([^/]+)%.lua$')) or dir:match('([^/]+)$')
  local sweeps, charts = {}, {}
  for i, s in ipairs(self.sweeps) do
    local files = {}
    for _, column in ipairs(s.sweep:numeric_columns()) do
      local file = ('%s_%s.svg'):format(name, (s.title:lower():gsub('[^%w]+', '_'):gsub('^_+', ''):gsub('_+$', '')) .. '_' .. column)
      fs.write_atomic(dir .. '/' .. file, s.sweep:svg(column, s.title .. ': ' .. column))
      files[#files + 1] = file
      charts[#charts + 1] = file
    end
    sweeps[i] = {title = s.title, table = s.sweep:data(), charts = files}
  end
  local rows = {}
  for i, r in ipairs(self.rows) do rows[i] = {claim = r.claim, published = r.published, ours = r.ours, value = r.value, verdict = r.verdict} end
  local doc = {name = name, title = self.title, rows = rows, notes = self.notes, sweeps = sweeps, charts = charts,
    data = published_data(self.data), provenance = rec}
  local json_path = fs.write_atomic(dir .. '/results.json', json.encode(doc) .. '\n')
  local md = {tostring(self), '', '<sub>' .. provenance_text.line(rec) .. '</sub>'}
  for _, s in ipairs(sweeps) do
    for _, file in ipairs(s.charts) do md[#md + 1] = ('\n![%s](%s)'):format(file, file) end
  end
  local md_path = fs.write_atomic(dir .. '/results.md', table.concat(md, '\n') .. '\n')
  return json_path, md_path
end

return Results
