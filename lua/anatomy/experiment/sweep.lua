-- Sweep: a function run over every combination of a grid of settings, and
-- the table of what it measured: printable, as Markdown and JSON, with one
-- chart per measured column (sklearn's ParameterGrid order: the first key
-- varies slowest).
local autopsy = require('anatomy.autopsy')
local results = require('anatomy.experiment.results')
local charts = require('anatomy.render.charts')
local result = require('anatomy.render.result')

local Sweep = {}
Sweep.__index = Sweep

local function text_of(v)
  if type(v) == 'number' then
    if v % 1 == 0 and math.abs(v) < 1e15 then return ('%d'):format(v) end
    return autopsy.format(v)
  end
  return tostring(v)
end

-- The grid as an ordered list of {key, values}: either such a list already,
-- or a table {key = {values}} taken in opts.order or sorted key order.
local function axes(grid, order)
  if type(grid) ~= 'table' then error(('experiment.sweep: grid must be a table, got %s'):format(type(grid)), 3) end
  local list = {}
  if #grid > 0 then
    for i, pair in ipairs(grid) do
      if type(pair) ~= 'table' or type(pair[1]) ~= 'string' or type(pair[2]) ~= 'table' then
        error(('experiment.sweep: grid[%d] must be {name, {values...}}'):format(i), 3)
      end
      list[i] = {pair[1], pair[2]}
    end
  else
    local keys = {}
    if order then
      for _, k in ipairs(order) do keys[#keys + 1] = k end
    else
      for k in pairs(grid) do keys[#keys + 1] = k end
      table.sort(keys)
    end
    for _, k in ipairs(keys) do
      if type(grid[k]) ~= 'table' then error(("experiment.sweep: grid.%s must be a list of values, got %s"):format(k, type(grid[k])), 3) end
      list[#list + 1] = {k, grid[k]}
    end
  end
  if #list == 0 then error('experiment.sweep: the grid is empty', 3) end
  for _, a in ipairs(list) do
    if #a[2] == 0 then error(("experiment.sweep: grid.%s has no values"):format(a[1]), 3) end
  end
  return list
end

-- Sweep.run(grid, fn, {order, columns, base, quiet}) -> sweep
-- fn(cfg) runs once per combination; cfg holds opts.base's keys and the
-- combination's, and fn returns a table of measured values (numbers or
-- strings). columns: the measured columns' order (default: sorted).
function Sweep.run(grid, fn, opts)
  opts = opts or {}
  if type(fn) ~= 'function' then error(('experiment.sweep: fn must be a function, got %s'):format(type(fn)), 2) end
  local list = axes(grid, opts.order)
  local self = setmetatable({keys = {}, measured = {}, rows = {}}, Sweep)
  for i, a in ipairs(list) do self.keys[i] = a[1] end
  local total = 1
  for _, a in ipairs(list) do total = total * #a[2] end
  local seen = {}
  local index = {}
  for i = 1, #list do index[i] = 1 end
  for n = 1, total do
    local cfg = {}
    for k, v in pairs(opts.base or {}) do cfg[k] = v end
    local label = {}
    for i, a in ipairs(list) do
      cfg[a[1]] = a[2][index[i]]
      label[i] = a[1] .. '=' .. tostring(a[2][index[i]])
    end
    if not opts.quiet then print(('\n== sweep %d/%d: %s'):format(n, total, table.concat(label, ', '))) end
    local measured = fn(cfg)
    if type(measured) ~= 'table' then
      error(('experiment.sweep: fn must return a table of measured values, got %s for %s'):format(type(measured), table.concat(label, ', ')), 2)
    end
    local row = {}
    for _, k in ipairs(self.keys) do row[k] = cfg[k] end
    for k, v in pairs(measured) do
      if row[k] ~= nil and not seen[k] then
        error(("experiment.sweep: fn returned '%s', which is also a grid key"):format(k), 2)
      end
      row[k] = v
      if not seen[k] then seen[k] = true; self.measured[#self.measured + 1] = k end
    end
    self.rows[n] = row
    for i = #list, 1, -1 do  -- the last key varies fastest
      index[i] = index[i] + 1
      if index[i] <= #list[i][2] then break end
      index[i] = 1
    end
  end
  if opts.columns then
    self.measured = {}
    for _, c in ipairs(opts.columns) do self.measured[#self.measured + 1] = c end
  else
    table.sort(self.measured)
  end
  return self
end

-- The header and the rows as text cells.
function Sweep:cells()
  local header = {}
  for _, k in ipairs(self.keys) do header[#header + 1] = k end
  for _, k in ipairs(self.measured) do header[#header + 1] = k end
  local rows = {}
  for i, r in ipairs(self.rows) do
    local cells = {}
    for c, k in ipairs(header) do cells[c] = r[k] == nil and '-' or text_of(r[k]) end
    rows[i] = cells
  end
  return header, rows
end

-- sweep:numeric_columns() -> the measured columns that hold numbers (the ones charted)
function Sweep:numeric_columns()
  local out = {}
  for _, k in ipairs(self.measured) do
    for _, r in ipairs(self.rows) do
      if type(r[k]) == 'number' then out[#out + 1] = k break end
    end
  end
  return out
end

-- sweep:markdown() -> the table in Markdown
function Sweep:markdown()
  local header, rows = self:cells()
  return results.markdown_table(header, rows)
end

function Sweep:__tostring()
  local header, rows = self:cells()
  local widths = {}
  for c = 1, #header do
    widths[c] = #header[c]
    for _, r in ipairs(rows) do widths[c] = math.max(widths[c], #r[c]) end
  end
  local lines = {}
  for _, r in ipairs({header, unpack(rows)}) do
    local parts = {}
    for c = 1, #header do parts[c] = (' '):rep(widths[c] - #r[c]) .. r[c] end
    lines[#lines + 1] = table.concat(parts, '  ')
  end
  return table.concat(lines, '\n')
end

-- sweep:data() -> {keys, measured, rows}, plain data (what json() writes)
function Sweep:data()
  return {keys = self.keys, measured = self.measured, rows = self.rows}
end

-- sweep:series(column[, x]) -> {{name, xs, ys}, ...}: column against the grid
-- key x (default: the first), one series per combination of the other keys.
function Sweep:series(column, x)
  x = x or self.keys[1]
  local order, by = {}, {}
  for _, r in ipairs(self.rows) do
    local label = {}
    for _, k in ipairs(self.keys) do if k ~= x then label[#label + 1] = k .. '=' .. tostring(r[k]) end end
    local name = #label > 0 and table.concat(label, ', ') or column
    if not by[name] then by[name] = {name, {}, {}}; order[#order + 1] = by[name] end
    local s = by[name]
    s[2][#s[2] + 1] = r[x]
    s[3][#s[3] + 1] = type(r[column]) == 'number' and r[column] or 0 / 0
  end
  return order
end

-- sweep:svg(column[, title]) -> a standalone SVG chart of one measured column
function Sweep:svg(column, title)
  local known = false
  for _, k in ipairs(self.measured) do known = known or k == column end
  if not known then
    error(("bad argument #1 to 'svg' (no measured column '%s'; the columns are %s)"):format(tostring(column), table.concat(self.measured, ', ')), 2)
  end
  return charts.line_chart{title = title or column, xlabel = self.keys[1], ylabel = column,
    series = self:series(column)}
end

-- sweep:html([title]) -> an HTML page: the table and one chart per measured
-- numeric column
function Sweep:html(title)
  local esc = charts.esc
  local header, rows = self:cells()
  title = esc(title or 'sweep')
  local parts = {'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>', title,
    '</title><style>body{font:14px/1.4 system-ui,sans-serif;margin:24px} table{border-collapse:collapse;font:12px monospace}',
    'td,th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right}</style></head><body><h1>', title,
    '</h1><table><thead><tr>'}
  for _, h in ipairs(header) do parts[#parts + 1] = '<th>' .. esc(h) .. '</th>' end
  parts[#parts + 1] = '</tr></thead><tbody>'
  for _, r in ipairs(rows) do
    local cells = {}
    for i, c in ipairs(r) do cells[i] = esc(c) end
    parts[#parts + 1] = '<tr><td>' .. table.concat(cells, '</td><td>') .. '</td></tr>'
  end
  parts[#parts + 1] = '</tbody></table>'
  for _, column in ipairs(self:numeric_columns()) do parts[#parts + 1] = '<p>' .. self:svg(column) .. '</p>' end
  parts[#parts + 1] = '</body></html>\n'
  return table.concat(parts)
end

-- sweep:json(path), sweep:report(path[, title]) (sweep:html(title) written)
-- and, in a notebook, the table and its charts: the protocol every result
-- shares (render/result.lua)
result.outputs(Sweep, 'sweep')

return Sweep
