-- autopsy.compare{a, b, ...}: several autopsies side by side. Each run is an
-- Autopsy, the path of one's JSON (a:json), or {label, autopsy}. The result
-- prints as one table a measure (a column a run, the cells that differ from
-- the first run by more than 10% marked *), renders as one HTML report
-- (each run's provenance, the loss curves and the depth profiles overlaid,
-- the tables with the differing cells highlighted) and saves as JSON.
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')
local format = require('anatomy.render.format')
local page = require('anatomy.render.page')
local options = require('anatomy.torch.options')
local charts = require('anatomy.render.charts')
local measures = require('anatomy.autopsy.measures')
local result = require('anatomy.render.result')

local fmt = format.number

local Comparison = {}
Comparison.__index = Comparison

-- The measures compared, in the autopsy's own names: the registry's compare ones (measures.lua).
Comparison.measures = measures.where('compare')
-- A cell differs when it is this far from the first run's (relative).
Comparison.tolerance = 0.10

local function load_run(item, i, where)
  local label, a = nil, item
  if type(item) == 'table' and getmetatable(item) == nil and item[2] ~= nil then label, a = item[1], item[2] end
  local data
  if type(a) == 'string' then
    local ok, decoded = pcall(json.decode, fs.read(a))
    if not ok or type(decoded) ~= 'table' or type(decoded.rows) ~= 'table' then
      error(('%s: run %d: %s is not an autopsy\'s JSON (a:json writes one)'):format(where, i, a), 3)
    end
    data = decoded
    label = label or a:match('([^/]+)%.json$') or a
  elseif type(a) == 'table' and type(a.data) == 'function' and type(a.rows) == 'table' then
    data = a:data()
  else
    error(('%s: run %d must be an autopsy, the path of its JSON, or {label, autopsy}; got %s'):format(where, i, type(a)), 3)
  end
  local config = data.provenance and data.provenance.config
  label = label or (config and config.label) or ('%d: %s'):format(i, tostring(data.model))
  return {label = tostring(label), data = data}
end

-- autopsy.compare(runs, {labels = {...}}) -> Comparison
local function compare(runs, opts)
  local where = 'autopsy.compare'
  opts = options.check(opts, {'labels'}, where, 2)
  if type(runs) ~= 'table' or #runs < 2 then
    error(('%s: expected a list of at least two autopsies, got %s'):format(where,
      type(runs) == 'table' and (#runs .. ' item' .. (#runs == 1 and '' or 's')) or type(runs)), 2)
  end
  local self = setmetatable({runs = {}}, Comparison)
  for i, item in ipairs(runs) do
    local r = load_run(item, i, where)
    if opts.labels and opts.labels[i] then r.label = tostring(opts.labels[i]) end
    self.runs[i] = r
  end
  -- the rows: the layers of the first run in order, then any other run's new ones
  local names, seen = {}, {}
  for _, r in ipairs(self.runs) do
    for _, row in ipairs(r.data.rows) do
      if not seen[row.name] then seen[row.name] = true; names[#names + 1] = row.name end
    end
    r.by_name = {}
    for _, row in ipairs(r.data.rows) do r.by_name[row.name] = row end
  end
  self.layers = names
  return self
end

-- Whether v differs from the first run's value by more than the tolerance.
local function differs(v, first)
  if type(v) ~= type(first) then return v ~= nil and first ~= nil end
  if type(v) ~= 'number' then return v ~= first end
  local scale = math.max(math.abs(first), math.abs(v), 1e-12)
  return math.abs(v - first) / scale > Comparison.tolerance
end

-- c:value(run, layer, measure) -> the value, or nil
function Comparison:value(i, layer, measure)
  local row = self.runs[i].by_name[layer]
  return row and row[measure]
end

-- The measures some run has a value for.
function Comparison:present()
  local out = {}
  for _, m in ipairs(Comparison.measures) do
    local any = false
    for i in ipairs(self.runs) do
      for _, layer in ipairs(self.layers) do any = any or self:value(i, layer, m) ~= nil end
    end
    if any then out[#out + 1] = m end
  end
  return out
end

function Comparison:__tostring()
  local out = {('comparison of %d runs (* differs from %s by more than %d%%)'):format(#self.runs, self.runs[1].label,
    math.floor(Comparison.tolerance * 100 + 0.5))}
  for i, r in ipairs(self.runs) do
    out[#out + 1] = ('  %s: %s, loss %s%s'):format(r.label, tostring(r.data.model), fmt(r.data.loss, 4),
      i > 1 and r.data.loss and self.runs[1].data.loss and (' (%+.1f%%)'):format(100 * (r.data.loss / self.runs[1].data.loss - 1)) or '')
  end
  local width = 5
  for _, l in ipairs(self.layers) do width = math.max(width, #l) end
  for _, m in ipairs(Comparison.measures) do width = math.max(width, #m) end
  local colw = {}
  for i, r in ipairs(self.runs) do colw[i] = math.max(10, #r.label + 1) end
  for _, m in ipairs(self:present()) do
    out[#out + 1] = ''
    local head = {('%-' .. width .. 's'):format(m)}
    for i, r in ipairs(self.runs) do head[#head + 1] = ('%' .. colw[i] .. 's'):format(r.label) end
    out[#out + 1] = table.concat(head, '  ')
    for _, layer in ipairs(self.layers) do
      local cells, any = {('%-' .. width .. 's'):format(layer)}, false
      local first = self:value(1, layer, m)
      for i in ipairs(self.runs) do
        local v = self:value(i, layer, m)
        any = any or v ~= nil
        local text = type(v) == 'number' and fmt(v) or (v and tostring(v) or '-')
        if i > 1 and differs(v, first) then text = text .. '*' else text = text .. ' ' end
        cells[#cells + 1] = ('%' .. colw[i] .. 's'):format(text)
      end
      if any then out[#out + 1] = table.concat(cells, '  ') end
    end
  end
  return table.concat(out, '\n')
end

-- c:data() -> the comparison as plain data (what c:json writes)
function Comparison:data()
  local runs = {}
  for i, r in ipairs(self.runs) do runs[i] = {label = r.label, autopsy = r.data} end
  return {layers = self.layers, measures = self:present(), tolerance = Comparison.tolerance, runs = runs}
end

-- c:html() -> the report as a string; c:report(path) writes it
function Comparison:html()
  local esc = charts.esc
  local parts = {}
  -- each run's provenance
  for _, r in ipairs(self.runs) do
    parts[#parts + 1] = ('<h2>%s</h2>'):format(esc(r.label))
    parts[#parts + 1] = ('<p>%s, loss %s</p>'):format(esc(tostring(r.data.model)), fmt(r.data.loss, 4))
    if r.data.provenance then parts[#parts + 1] = page.provenance(r.data.provenance) end
  end
  -- overlaid curves: the training loss, and each measure along depth
  local figs = {}
  local loss_series = {}
  for _, r in ipairs(self.runs) do
    local h = r.data.history
    if h and h.train and #h.train > 0 then
      local xs = {}
      for i = 1, #h.train do xs[i] = (h.first_step or 1) + i - 1 end
      loss_series[#loss_series + 1] = {r.label, xs, h.train}
    end
  end
  if #loss_series > 0 then figs[#figs + 1] = charts.lines('Training loss', loss_series, {ylabel = 'loss (nats)'}) end
  -- the registry's depth profiles: {name, title, over every row}
  local by_depth = {}
  for _, m in ipairs(measures.rows) do
    if m.chart and m.chart.compare then by_depth[#by_depth + 1] = {m.name, m.chart.compare, m.chart.over == 'rows'} end
  end
  for _, m in ipairs(by_depth) do
    local series, names = {}, {}
    for _, r in ipairs(self.runs) do
      local xs, ys, k = {}, {}, 0
      for _, row in ipairs(r.data.rows) do
        if row.kind == 'block' or m[3] then
          k = k + 1
          names[k] = names[k] or row.name  -- the axis is labelled with the rows' names (the first run's)
          if type(row[m[1]]) == 'number' then xs[#xs + 1], ys[#ys + 1] = k, row[m[1]] end
        end
      end
      if #xs > 0 then series[#series + 1] = {r.label, xs, ys} end
    end
    if #series > 0 then
      figs[#figs + 1] = charts.lines(m[2], series, {xlabel = m[3] and 'row' or 'layer', ylabel = m[1], xnames = names})
    end
  end
  parts[#parts + 1] = '<h2>Curves</h2><div class="charts">' .. table.concat(figs) .. '</div>'
  -- the tables, a column a run, the differing cells highlighted
  parts[#parts + 1] = ('<h2>Per layer</h2><p class="note">highlighted: more than %d%% from %s</p><div class="charts">'):format(
    math.floor(Comparison.tolerance * 100 + 0.5), esc(self.runs[1].label))
  for _, m in ipairs(self:present()) do
    local t = {('<table class="compare"><thead><tr><th>%s</th>'):format(esc(m))}
    for _, r in ipairs(self.runs) do t[#t + 1] = '<th>' .. esc(r.label) .. '</th>' end
    t[#t + 1] = '</tr></thead><tbody>'
    for _, layer in ipairs(self.layers) do
      local first = self:value(1, layer, m)
      local row, any = {'<tr><td>' .. esc(layer) .. '</td>'}, false
      for i in ipairs(self.runs) do
        local v = self:value(i, layer, m)
        any = any or v ~= nil
        local text = type(v) == 'number' and fmt(v) or (v and tostring(v) or '-')
        row[#row + 1] = ('<td%s>%s</td>'):format(i > 1 and differs(v, first) and ' class="differs"' or '', esc(text))
      end
      if any then t[#t + 1] = table.concat(row) .. '</tr>' end
    end
    t[#t + 1] = '</tbody></table>'
    parts[#parts + 1] = table.concat(t)
  end
  parts[#parts + 1] = '</div>'
  local labels = {}
  for i, r in ipairs(self.runs) do labels[i] = r.label end
  return page.new('Comparison: ' .. table.concat(labels, ' vs '), table.concat(parts))
end

-- c:json(path), c:report(path) and the notebook's view (render/result.lua)
result.outputs(Comparison, 'c')

return {compare = compare, Comparison = Comparison}
