-- autopsy.series: the autopsy at each checkpoint of a training run, to see
-- *when* a layer changed: a Hub repository's revisions (Pythia's step1000,
-- step2000, ...), a folder of a run's checkpoints (train.fit's
-- keep_checkpoints, or transformers' checkpoint-N folders), or a list of
-- checkpoint folders. One checkpoint is loaded at a time and let go before
-- the next; every autopsy reads the same batches (the generator is seeded
-- before each). The result is a table per measure × layer × checkpoint, the
-- verdict changes ("blocks.3: worker until step 8000, passenger from step
-- 16000"), and a report that charts each measure over the training steps
-- with those changes marked.
local torch = require('anatomy.torch')
local fs = require('anatomy.io.fs')
local hub = require('anatomy.io.hub')
local options = require('anatomy.torch.options')
local format = require('anatomy.render.format')
local charts = require('anatomy.render.charts')
local page = require('anatomy.render.page')
local nn = require('anatomy.nn')
local checkpoint = require('anatomy.train.checkpoint')
local run = require('anatomy.autopsy.run')
local measures = require('anatomy.autopsy.measures')
local result = require('anatomy.render.result')
local models = require('anatomy.models')

local fmt = format.number
local function step_number(v) return v % 1 == 0 and ('%d'):format(v) or fmt(v) end

local Series = {}
Series.__index = Series

-- The measures a series tabulates and charts (the autopsy's own names): the registry's series ones.
Series.measure_names = measures.where('series')

-- The step a name says: the last number in it (step1000, checkpoint-500, run.step20.safetensors)
local function step_of(name)
  local n
  for d in tostring(name):gmatch('%d+') do n = d end
  return n and tonumber(n)
end

-- Loads an anatomy checkpoint's weights into model (its optimizer and
-- generator state are not needed); returns its step.
local function load_weights(path, model, where)
  local ok, tensors_or_why, meta, sd = pcall(checkpoint.read, path)
  if not ok then error(('%s: %s'):format(where, tostring(tensors_or_why):gsub('^[^\n]-:%d+: ', '')), 0) end
  if meta.class and meta.class ~= nn.typename(model) then
    error(("%s: '%s' holds a %s, and opts.model is a %s"):format(where, path, meta.class, nn.typename(model)), 0)
  end
  model:load_state_dict(sd)
  return tonumber(meta.step)
end

-- The checkpoints of a source, in order: {label, step, load = fn -> model, origin}
local function checkpoints(source, o, where)
  local list = {}
  local hf = {dtype = o.dtype, token = o.token, cache_dir = o.cache_dir, local_files_only = o.local_files_only}
  local function from_folder(folder, label)
    list[#list + 1] = {label = label or folder:match('([^/]+)/*$'), step = step_of(label or folder:match('([^/]+)/*$')),
      origin = {folder = folder}, load = function() return (models.from_pretrained(folder, {dtype = o.dtype})) end}
  end
  if type(source) == 'table' then
    for i, folder in ipairs(source) do
      if type(folder) ~= 'string' or not fs.is_dir(folder) then
        error(('%s: source[%d] must be a checkpoint folder, got %s'):format(where, i, tostring(folder)), 0)
      end
      from_folder(folder)
    end
  elseif type(source) ~= 'string' then
    error(('%s: source must be a Hub repository id, a folder of checkpoints or a list of folders, got %s'):format(where, type(source)), 0)
  elseif fs.is_dir(source) then
    if o.revisions then error(("%s: revisions are a Hub repository's; '%s' is a local folder"):format(where, source), 0) end
    if fs.exists(source .. '/config.json') then
      error(("%s: '%s' is one checkpoint; a series needs a folder of them (or a Hub repository and its revisions)"):format(where, source), 0)
    end
    for _, name in ipairs(fs.list(source)) do
      local path = source .. '/' .. name
      if fs.is_dir(path) and fs.exists(path .. '/config.json') then
        from_folder(path, name)
      elseif name:match('%.step%d+%.safetensors$') then
        if not o.model then
          error(("%s: '%s' holds anatomy checkpoints (%s); give the model they were trained as opts.model"):format(where, source, name), 0)
        end
        list[#list + 1] = {label = name:match('(step%d+)%.safetensors$'), step = step_of(name), origin = {file = path},
          load = function() load_weights(path, o.model, where); return o.model end}
      end
    end
    if #list == 0 then
      error(("%s: '%s' holds no checkpoints (subfolders with config.json, or train.fit's <name>.step<N>.safetensors)"):format(where, source), 0)
    end
  else
    if not hub.is_repo_id(source) then error(("%s: '%s' is not a folder (nor a Hub repository id)"):format(where, source), 0) end
    if type(o.revisions) ~= 'table' or #o.revisions == 0 then
      error(("%s: a Hub repository needs opts.revisions, a list such as {'step1000', 'step2000'} (hub.list_repo_refs lists them)"):format(where), 0)
    end
    for i, r in ipairs(o.revisions) do
      if type(r) ~= 'string' or r == '' then error(('%s: revisions[%d] must be a branch, tag or commit name, got %s'):format(where, i, tostring(r)), 0) end
      list[#list + 1] = {label = r, step = step_of(r), origin = {repo_id = source, revision = r},
        load = function()
          local opts = {revision = r}
          for k, v in pairs(hf) do opts[k] = v end
          local m = models.from_pretrained(source, opts)
          local src = rawget(m, 'hf_source')
          if src then list[i].origin.commit, list[i].origin.weights = src.commit, src.weights end
          return m
        end}
    end
  end
  if o.steps then
    if type(o.steps) ~= 'table' or #o.steps ~= #list then
      error(('%s: steps must list one number a checkpoint (%d), got %s'):format(where, #list,
        type(o.steps) == 'table' and #o.steps or type(o.steps)), 0)
    end
    for i, s in ipairs(o.steps) do
      if type(s) ~= 'number' or s ~= s then error(('%s: steps[%d] must be a number, got %s'):format(where, i, tostring(s)), 0) end
      list[i].step = s
    end
  end
  local numbered = true
  for _, c in ipairs(list) do numbered = numbered and c.step ~= nil end
  if not numbered then  -- no step in some name: the checkpoints' order is the axis
    for i, c in ipairs(list) do c.step = i end
  end
  if type(source) == 'string' and fs.is_dir(source) and numbered then
    table.sort(list, function(a, b) return a.step < b.step end)
  end
  list.numbered = numbered
  return list
end

-- autopsy.series(source, {revisions, model, steps, seed = 0, dtype, token,
-- cache_dir, local_files_only, quiet}, data, autopsy_opts) -> Series
-- source: a Hub repository id with opts.revisions; a folder of checkpoints
-- (subfolders with config.json, or train.fit's <name>.step<N>.safetensors
-- with opts.model, the model they were trained as); or a list of folders.
-- data and autopsy_opts are autopsy.run's, the same at every checkpoint.
local function series(source, o, data, aopts)
  local where = 'autopsy.series'
  o = options.check(o, {revisions = true, model = true, steps = true, seed = true, dtype = true, token = true, cache_dir = true,
    local_files_only = true, quiet = true}, where, 2)
  if data == nil then error(('%s: data (a corpus or {inputs, targets}) is required'):format(where), 2) end
  if aopts ~= nil and type(aopts) ~= 'table' then error(('%s: autopsy options must be a table, got %s'):format(where, type(aopts)), 2) end
  local seed = o.seed or 0
  if type(seed) ~= 'number' or seed ~= seed or seed % 1 ~= 0 then error(('%s: seed must be an integer, got %s'):format(where, tostring(seed)), 2) end
  local ok, list = pcall(checkpoints, source, o, where)
  if not ok then error(list, 2) end
  local self = setmetatable({source = type(source) == 'string' and source or 'checkpoint folders', labels = {}, steps = {},
    origins = {}, runs = {}, numbered = list.numbered}, Series)
  for i, c in ipairs(list) do
    local loaded, model = pcall(c.load)
    if not loaded then error(('%s: checkpoint %s: %s'):format(where, c.label, tostring(model):gsub('^[^\n]-:%d+: ', '')), 2) end
    local opts = {}
    for k, v in pairs(aopts or {}) do opts[k] = v end
    torch.manual_seed(seed)  -- the same batches, and the same draws, at every checkpoint
    local a = run(model, data, opts)
    self.labels[i], self.steps[i], self.origins[i], self.runs[i] = c.label, c.step, c.origin, a
    if not o.quiet then
      print(('series: %d/%d %s (step %s): loss %s'):format(i, #list, c.label, step_number(c.step), fmt(a.loss, 4)))
    end
    model = nil  -- let the checkpoint go before the next one loads
    collectgarbage()
    collectgarbage()
  end
  self:tabulate()
  for _, d in ipairs(self.duplicates) do
    io.stderr:write(('anatomy: autopsy.series: %s and %s serve the same weights (%s): their columns are one checkpoint measured twice\n')
      :format(self.labels[d[1]], self.labels[d[2]], self.origins[d[1]].weights))
  end
  return self
end

-- s.layers, s.table[measure][layer][i], s.verdicts[layer][i] and s.changes
function Series:tabulate()
  local names, seen = {}, {}
  for _, a in ipairs(self.runs) do
    for _, r in ipairs(a.rows) do
      if not seen[r.name] then seen[r.name] = true; names[#names + 1] = r.name end
    end
  end
  self.layers = names
  self.table, self.verdicts, self.changes = {}, {}, {}
  for _, m in ipairs(Series.measure_names) do
    local t, any = {}, false
    for _, layer in ipairs(names) do t[layer] = {} end
    for i, a in ipairs(self.runs) do
      for _, r in ipairs(a.rows) do
        if type(r[m]) == 'number' then t[r.name][i] = r[m]; any = true end
      end
    end
    if any then self.table[m] = t end
  end
  -- checkpoints whose weights are the same files (the Hub's content hashes):
  -- a revision that serves another's weights is no new point of the run
  self.duplicates = {}
  for i = 2, #self.runs do
    for j = 1, i - 1 do
      local w = self.origins[i].weights
      if w and w == self.origins[j].weights then self.duplicates[#self.duplicates + 1] = {j, i}; break end
    end
  end
  for _, layer in ipairs(names) do self.verdicts[layer] = {} end
  for i, a in ipairs(self.runs) do
    for _, r in ipairs(a.rows) do self.verdicts[r.name][i] = r.verdict end
  end
  for _, layer in ipairs(names) do
    local v = self.verdicts[layer]
    for i = 2, #self.runs do
      if v[i] ~= v[i - 1] and v[i] and v[i - 1] then
        self.changes[#self.changes + 1] = {layer = layer, from = v[i - 1], to = v[i], before = self.steps[i - 1], after = self.steps[i],
          index = i}
      end
    end
  end
end

-- s:measures() -> the measures some checkpoint has a number for, in Series.measure_names' order
function Series:measures()
  local out = {}
  for _, m in ipairs(Series.measure_names) do if self.table[m] then out[#out + 1] = m end end
  return out
end

local function step_text(self, i)
  return self.numbered and ('step ' .. step_number(self.steps[i])) or self.labels[i]
end

-- s:smoke() -> whether the autopsies are a smoke run's (--smoke=true): their
-- verdicts then mean nothing, nor do their changes
function Series:smoke()
  for _, layer in ipairs(self.layers) do
    for _, v in pairs(self.verdicts[layer]) do if v == 'smoke run: not meaningful' then return true end end
  end
  return false
end

-- s:story(layer) -> "blocks.3: worker until step 8000, passenger from step
-- 16000", or nil when the layer's verdict never changed
function Series:story(layer)
  local v = self.verdicts[layer]
  if not v then error(("s:story: no layer '%s' in this series"):format(tostring(layer)), 2) end
  local segments = {}
  for i = 1, #self.runs do
    local last = segments[#segments]
    if v[i] and (not last or last.verdict ~= v[i]) then segments[#segments + 1] = {verdict = v[i], first = i, last = i}
    elseif last and v[i] == last.verdict then last.last = i end
  end
  if #segments < 2 then return nil end
  local parts = {}
  for k, seg in ipairs(segments) do
    if k == 1 then parts[k] = ('%s until %s'):format(seg.verdict, step_text(self, seg.last))
    elseif k == #segments then parts[k] = ('%s from %s'):format(seg.verdict, step_text(self, seg.first))
    elseif seg.first == seg.last then parts[k] = ('%s at %s'):format(seg.verdict, step_text(self, seg.first))
    else parts[k] = ('%s from %s to %s'):format(seg.verdict, step_text(self, seg.first), step_text(self, seg.last)) end
  end
  return layer .. ': ' .. table.concat(parts, ', ')
end

-- s:stories() -> every changed layer's story, in layer order
function Series:stories()
  local out = {}
  for _, layer in ipairs(self.layers) do out[#out + 1] = self:story(layer) end
  return out
end

function Series:__tostring()
  local out = {('autopsy series of %s: %d checkpoints (%s)'):format(self.source, #self.runs, table.concat(self.labels, ', '))}
  local losses = {}
  for i, a in ipairs(self.runs) do losses[i] = fmt(a.loss, 4) end
  out[#out + 1] = '  loss: ' .. table.concat(losses, ', ')
  local stories = self:stories()
  for _, d in ipairs(self.duplicates) do
    out[#out + 1] = ('  warning: %s and %s serve the same weights (%s): one checkpoint measured twice'):format(
      self.labels[d[1]], self.labels[d[2]], self.origins[d[1]].weights)
  end
  out[#out + 1] = self:smoke() and '  verdicts: a smoke run\'s, not meaningful (no change is read from them)'
    or #stories == 0 and '  no layer changed its verdict' or '  verdict changes:'
  for _, s in ipairs(stories) do out[#out + 1] = '    ' .. s end
  local width = 7
  for _, l in ipairs(self.layers) do width = math.max(width, #l) end
  for _, m in ipairs(self:measures()) do width = math.max(width, #m) end
  for _, m in ipairs(self:measures()) do
    out[#out + 1] = ''
    local head = {('%-' .. width .. 's'):format(m)}
    for i in ipairs(self.runs) do head[#head + 1] = ('%10s'):format(self.labels[i]:sub(1, 10)) end
    out[#out + 1] = table.concat(head, ' ')
    for _, layer in ipairs(self.layers) do
      local row, any = {('%-' .. width .. 's'):format(layer)}, false
      for i in ipairs(self.runs) do
        local v = self.table[m][layer][i]
        any = any or v ~= nil
        row[#row + 1] = ('%10s'):format(v and fmt(v) or '-')
      end
      if any then out[#out + 1] = table.concat(row, ' ') end
    end
  end
  return table.concat(out, '\n')
end

-- s:data() -> plain data (what s:json writes): the checkpoints, the table, the
-- verdicts, the changes and each autopsy
function Series:data()
  local runs = {}
  for i, a in ipairs(self.runs) do runs[i] = {label = self.labels[i], step = self.steps[i], origin = self.origins[i], autopsy = a:data()} end
  return {source = self.source, labels = self.labels, steps = self.steps, layers = self.layers, table = self.table,
    verdicts = self.verdicts, changes = self.changes, stories = self:stories(), duplicates = self.duplicates, runs = runs}
end

-- s:html() -> the report: the verdict changes, a chart per measure (a line a
-- layer over the steps, each verdict change marked) with its table, the
-- verdicts per checkpoint, each checkpoint's provenance
function Series:html()
  local esc = charts.esc
  local parts = {}
  local stories = self:stories()
  parts[#parts + 1] = ('<p>%d checkpoints of %s: %s</p>'):format(#self.runs, esc(self.source), esc(table.concat(self.labels, ', ')))
  for _, d in ipairs(self.duplicates) do
    parts[#parts + 1] = ('<p class="warning">%s and %s serve the same weights (%s): their columns are one checkpoint measured twice.</p>')
      :format(esc(self.labels[d[1]]), esc(self.labels[d[2]]), esc(self.origins[d[1]].weights))
  end
  parts[#parts + 1] = '<h2>Verdict changes</h2>'
  if self:smoke() then
    parts[#parts + 1] = '<p>A smoke run (--smoke=true): its verdicts, and so their changes, are not meaningful.</p>'
  elseif #stories == 0 then
    parts[#parts + 1] = '<p>No layer changed its verdict across these checkpoints.</p>'
  else
    local items = {}
    for _, s in ipairs(stories) do items[#items + 1] = '<li>' .. esc(s) .. '</li>' end
    parts[#parts + 1] = '<ul>' .. table.concat(items) .. '</ul>'
  end
  local marks = {}
  for _, c in ipairs(self.changes) do
    marks[#marks + 1] = {x = self.steps[c.index], label = ('%s: %s → %s'):format(c.layer, c.from, c.to)}
  end
  local figs = {}
  local losses = {}
  for i, a in ipairs(self.runs) do losses[i] = a.loss end
  local xlabel = self.numbered and 'step' or 'checkpoint'
  figs[#figs + 1] = charts.lines('loss at each checkpoint', {{'loss', self.steps, losses}}, {xlabel = xlabel, ylabel = 'loss (nats)'})
  for _, m in ipairs(self:measures()) do
    local lines = {}
    for _, layer in ipairs(self.layers) do
      local xs, ys = {}, {}
      for i in ipairs(self.runs) do
        local v = self.table[m][layer][i]
        if v then xs[#xs + 1], ys[#ys + 1] = self.steps[i], v end
      end
      if #xs > 0 then lines[#lines + 1] = {layer, xs, ys} end
    end
    figs[#figs + 1] = charts.lines(m .. ' over training', lines, {xlabel = xlabel, ylabel = m, marks = marks,
      note = #marks > 0 and 'dashed lines: a verdict changed between the checkpoint before and this one' or nil})
  end
  parts[#parts + 1] = '<h2>Measures over training</h2><div class="charts">' .. table.concat(figs) .. '</div>'
  local t = {'<h2>Verdicts</h2><table class="compare"><thead><tr><th>layer</th>'}
  for i in ipairs(self.runs) do t[#t + 1] = '<th>' .. esc(self.labels[i]) .. '</th>' end
  t[#t + 1] = '</tr></thead><tbody>'
  for _, layer in ipairs(self.layers) do
    local row = {'<tr><td>' .. esc(layer) .. '</td>'}
    for i in ipairs(self.runs) do
      local v = self.verdicts[layer][i]
      local changed = i > 1 and v ~= self.verdicts[layer][i - 1]
      row[#row + 1] = ('<td%s>%s</td>'):format(changed and ' class="differs"' or '', esc(v or '-'))
    end
    t[#t + 1] = table.concat(row) .. '</tr>'
  end
  t[#t + 1] = '</tbody></table>'
  parts[#parts + 1] = table.concat(t)
  parts[#parts + 1] = '<h2>Checkpoints</h2>'
  for i, a in ipairs(self.runs) do
    local o = self.origins[i]
    local where_from = o.repo_id and ('%s at %s%s'):format(o.repo_id, o.revision, o.commit and (' (commit ' .. o.commit .. ')') or '')
      or o.folder or o.file
    parts[#parts + 1] = ('<h3>%s</h3><p>%s, loss %s</p>'):format(esc(self.labels[i]), esc(where_from), fmt(a.loss, 4))
    if a.provenance then parts[#parts + 1] = page.provenance(a.provenance) end
  end
  return page.new('Autopsy series: ' .. self.source, table.concat(parts))
end

-- s:json(path), s:report(path) and the notebook's view (render/result.lua)
result.outputs(Series, 's')

return {series = series, Series = Series, step_of = step_of}
