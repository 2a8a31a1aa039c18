-- charts: inline SVG charts for the HTML reports (bars, signed bars, lines,
-- standalone line charts for sweeps; heatmaps and attention thumbnails from
-- render/heatmap.lua, component graphs from render/graph.lua, the parts they share from render/svg.lua). Every chart
-- carries data-points (how many values it draws), so a test can see that it
-- has data. No scripts, nothing fetched.
local format = require('anatomy.render.format')
local svg = require('anatomy.render.svg')
local heatmap = require('anatomy.render.heatmap')
local graph = require('anatomy.render.graph')
local charts = {}

local palette = svg.palette
local esc = svg.esc
local num = svg.num
local finite = svg.finite
local range = svg.range
local nice_ticks = svg.nice_ticks
local tick_text = svg.tick_text
local figure = svg.figure
local y_axis = svg.y_axis
local value_range = svg.value_range
local longest = svg.longest

-- charts.esc(s), charts.nice_ticks(lo, hi, n): render/svg.lua's, for the
-- pages and figures that write SVG of their own
charts.esc = svg.esc
charts.nice_ticks = svg.nice_ticks
-- charts.heatmap and charts.attention_map: render/heatmap.lua
charts.heatmap = heatmap.heatmap
charts.attention_map = heatmap.attention_map
-- charts.graph: render/graph.lua (components by layer and the edges between them)
charts.graph = graph.graph

-- The slots of a bar chart over pw pixels from L: for label i, its slot's
-- left edge x and width bw; bar(i, v, x, bw) draws each finite value,
-- tick(i, x, bw) each label. Returns how many values were drawn and the
-- rows {label, value} of the table under the chart (the same data).
local function each_bar(labels, values, L, pw, bar, tick)
  local n = #labels
  local bw = pw / math.max(n, 1)
  local points, rows = 0, {}
  for i = 1, n do
    local v = values[i]
    local x = L + (i - 1) * bw
    if finite(v) then
      points = points + 1
      bar(i, v, x, bw)
    end
    rows[#rows + 1] = {labels[i], v}
    tick(i, x, bw)
  end
  return points, rows
end

-- charts.bars(title, labels, values, opts): one bar per label. opts (or a
-- note string): note, ylabel, xlabel, reference = {value, label} (a dashed
-- line, e.g. the full model's loss), offset (the values are differences
-- from it; recorded on the chart). The value axis starts at 0: a bar's
-- length is its value.
function charts.bars(title, labels, values, opts)
  if type(opts) ~= 'table' then opts = {note = opts} end
  local ref = opts.reference
  local lo, hi = value_range(values, ref and {ref[1]} or nil, true)
  local n = #labels
  local rotate = n > 6 or longest(labels) > 10
  local B = rotate and math.min(150, 28 + math.floor(longest(labels) * 5.2)) or 40
  local W = math.max(560, 70 + n * 14)
  local L, T, R = 64, 14, 16
  local pw, ph = W - L - R, 170
  local H = T + ph + B
  local parts = {}
  local y = y_axis(parts, lo, hi, L, T, pw, ph, opts.ylabel)
  local base = math.max(lo, math.min(0, hi))
  local points, rows = each_bar(labels, values, L, pw, function(i, v, x, bw)
    local y0, y1 = y(base), y(v)
    parts[#parts + 1] = ('<rect x="%s" y="%s" width="%s" height="%s" fill="%s" data-value="%s"><title>%s: %s</title></rect>'):format(
      num(x + bw * 0.12), num(math.min(y0, y1)), num(math.max(bw * 0.76, 1)), num(math.max(math.abs(y1 - y0), 0.5)), palette[1],
      ('%.9g'):format(v), esc(labels[i]), format.number(v, 4))
    if n <= 8 then
      parts[#parts + 1] = ('<text x="%s" y="%s" class="value" text-anchor="middle">%s</text>'):format(num(x + bw / 2), num(math.min(y0, y1) - 3), format.number(v, 4))
    end
  end, function(i, x, bw)
    if rotate then
      parts[#parts + 1] = ('<text transform="translate(%s,%d) rotate(-45)" class="xtick" text-anchor="end">%s</text>'):format(
        num(x + bw / 2 + 3), T + ph + 10, esc(labels[i]))
    else
      parts[#parts + 1] = ('<text x="%s" y="%d" class="xtick" text-anchor="middle">%s</text>'):format(num(x + bw / 2), T + ph + 14, esc(labels[i]))
    end
  end)
  parts[#parts + 1] = ('<line x1="%d" y1="%s" x2="%d" y2="%s" class="axis"/>'):format(L, num(y(base)), L + pw, num(y(base)))
  if ref and finite(ref[1]) then
    parts[#parts + 1] = ('<line x1="%d" y1="%s" x2="%d" y2="%s" class="reference"/><text x="%d" y="%s" class="legend" text-anchor="start">%s</text>')
      :format(L, num(y(ref[1])), L + pw, num(y(ref[1])), L + 4, num(y(ref[1]) - 3), esc(('%s %s'):format(ref[2] or 'reference', format.number(ref[1], 4))))
  end
  parts[#parts + 1] = ('<text x="%s" y="%d" class="xlabel" text-anchor="middle">%s</text>'):format(num(L + pw / 2), H - 4, esc(opts.xlabel or 'layer'))
  local note = opts.note
  return figure{title = title, kind = 'bars', points = points, w = W, h = H, body = table.concat(parts), note = note,
    head = {opts.xlabel or 'layer', opts.ylabel or 'value'}, table = rows, offset = opts.offset}
end

-- charts.signed_bars(title, labels, values, note): bars from a zero line, up
-- (blue) for positive values and down (red) for negative ones, each labelled
-- below and titled with its value, on a value axis with round ticks.
function charts.signed_bars(title, labels, values, opts)
  if type(opts) ~= 'table' then opts = {note = opts} end
  local hi, lo = 0, 0
  for _, v in pairs(values) do if finite(v) then hi, lo = math.max(hi, v), math.min(lo, v) end end
  if hi == lo then hi = 1 end
  local pad = (hi - lo) * 0.05
  hi, lo = hi + pad, lo - (lo < 0 and pad or 0)
  local n = #labels
  local L, T, R = 64, 14, 16
  local B = math.min(150, 28 + math.floor(longest(labels) * 5.2))
  local W = math.max(560, 70 + n * 12)
  local pw, ph = W - L - R, 170
  local H = T + ph + B
  local parts = {}
  local y = y_axis(parts, lo, hi, L, T, pw, ph, opts.ylabel or 'contribution')
  local points, rows = each_bar(labels, values, L, pw, function(i, v, x, bw)
    local y1, y2 = y(math.max(v, 0)), y(math.min(v, 0))
    parts[#parts + 1] = ('<rect x="%s" y="%s" width="%s" height="%s" fill="%s"><title>%s: %s</title></rect>'):format(
      num(x + 1), num(y1), num(math.max(bw - 2, 1)), num(math.max(y2 - y1, 0.5)), v >= 0 and palette[1] or palette[2], esc(labels[i]), format.number(v, 4))
  end, function(i, x, bw)
    parts[#parts + 1] = ('<text transform="translate(%s,%d) rotate(-60)" class="xtick" text-anchor="end">%s</text>'):format(
      num(x + bw / 2 + 3), T + ph + 10, esc(labels[i]))
  end)
  parts[#parts + 1] = ('<line x1="%d" y1="%s" x2="%d" y2="%s" class="axis"/>'):format(L, num(y(0)), L + pw, num(y(0)))
  parts[#parts + 1] = ('<text x="%s" y="%d" class="xlabel" text-anchor="middle">%s</text>'):format(num(L + pw / 2), H - 4, esc(opts.xlabel or 'component'))
  parts[#parts + 1] = ('<g class="legend"><rect x="%d" y="%d" width="10" height="10" fill="%s"/><text x="%d" y="%d">positive</text>'
    .. '<rect x="%d" y="%d" width="10" height="10" fill="%s"/><text x="%d" y="%d">negative</text></g>'):format(
    W - 150, T, palette[1], W - 136, T + 9, W - 80, T, palette[2], W - 66, T + 9)
  return figure{title = title, kind = 'signed-bars', points = points, w = W, h = H, body = table.concat(parts), note = opts.note,
    head = {opts.xlabel or 'component', opts.ylabel or 'contribution'}, table = rows}
end

-- charts.lines(title, series, opts): series = {{name, xs, ys}, ...} drawn
-- against a step axis (opts.xlabel, default 'step') with round ticks on both
-- axes and a legend; every point carries its value on hover (up to 400 a
-- series), and the numbers are in a table under the chart. opts.marks =
-- {{x = step, label = text}, ...}: dashed vertical lines at those x, their
-- text on hover (several at one x share a line).
function charts.lines(title, series, opts)
  if type(opts) ~= 'table' then opts = {note = opts} end
  local xs_all, ys_all = {}, {}
  for _, s in ipairs(series) do
    for i = 1, #s[2] do
      if finite(s[3][i]) then xs_all[#xs_all + 1] = s[2][i]; ys_all[#ys_all + 1] = s[3][i] end
    end
  end
  local xlo, xhi = range(xs_all)
  local ylo, yhi = range(ys_all)
  local pad = (yhi - ylo) * 0.06
  ylo, yhi = ylo - pad, yhi + pad
  local W, L, T, R, B = 560, 64, 14, 130, 40
  local pw, ph = W - L - R, 170
  local H = T + ph + B
  local parts = {}
  local y = y_axis(parts, ylo, yhi, L, T, pw, ph, opts.ylabel)
  local function x(v) return L + (v - xlo) / (xhi - xlo) * pw end
  local integral = true  -- steps and layer numbers: whole ticks only
  for _, v in ipairs(xs_all) do integral = integral and v % 1 == 0 end
  local xticks = nice_ticks(xlo, xhi, integral and math.max(1, math.min(6, xhi - xlo)) or 6)
  local names = opts.xnames  -- x -> a name (a row of a table): every x labelled by it, slanted
  if names then
    xticks = {}
    for v = math.ceil(xlo), math.floor(xhi) do if names[v] then xticks[#xticks + 1] = v end end
    H = H + math.min(90, 6 * longest(names))
  end
  for _, v in ipairs(xticks) do
    local label = names and names[v]
    if label then
      parts[#parts + 1] = ('<line x1="%s" y1="%d" x2="%s" y2="%d" class="axis"/><text transform="translate(%s,%d) rotate(-45)" class="xtick" text-anchor="end">%s</text>')
        :format(num(x(v)), T + ph, num(x(v)), T + ph + 4, num(x(v) + 3), T + ph + 12, esc(label))
    else
      parts[#parts + 1] = ('<line x1="%s" y1="%d" x2="%s" y2="%d" class="axis"/><text x="%s" y="%d" class="xtick" text-anchor="middle">%s</text>')
        :format(num(x(v)), T + ph, num(x(v)), T + ph + 4, num(x(v)), T + ph + 15, tick_text(v, xticks))
    end
  end
  parts[#parts + 1] = ('<line x1="%d" y1="%d" x2="%d" y2="%d" class="axis"/>'):format(L, T + ph, L + pw, T + ph)
  parts[#parts + 1] = ('<text x="%s" y="%d" class="xlabel" text-anchor="middle">%s</text>'):format(num(L + pw / 2), H - 4, esc(opts.xlabel or 'step'))
  local at, order = {}, {}
  for _, m in ipairs(opts.marks or {}) do
    if finite(m.x) and m.x >= xlo and m.x <= xhi then
      if not at[m.x] then at[m.x] = {}; order[#order + 1] = m.x end
      at[m.x][#at[m.x] + 1] = m.label
    end
  end
  for _, v in ipairs(order) do
    parts[#parts + 1] = ('<line x1="%s" y1="%d" x2="%s" y2="%d" class="mark" stroke="#b45309" stroke-dasharray="4 3"><title>%s</title></line>')
      :format(num(x(v)), T, num(x(v)), T + ph, esc(table.concat(at[v], '; ')))
  end
  local points, legend = 0, {'<g class="legend">'}
  local rows, by_x = {}, {}
  for k, s in ipairs(series) do
    local color = palette[(k - 1) % #palette + 1]
    local coords, marks = {}, {}
    local stride = math.max(1, math.ceil(#s[2] / 400))
    for i = 1, #s[2] do
      local v = s[3][i]
      if finite(v) then
        points = points + 1
        coords[#coords + 1] = num(x(s[2][i])) .. ',' .. num(y(v))
        if i % stride == 0 or i == #s[2] then
          marks[#marks + 1] = ('<circle cx="%s" cy="%s" r="2" fill="%s"><title>%s at %s: %s</title></circle>'):format(
            num(x(s[2][i])), num(y(v)), color, esc(s[1]), format.number(s[2][i]), format.number(v, 4))
        end
        by_x[s[2][i]] = by_x[s[2][i]] or {}
        by_x[s[2][i]][k] = v
      end
    end
    parts[#parts + 1] = ('<polyline points="%s" fill="none" stroke="%s" stroke-width="1.5"/>'):format(table.concat(coords, ' '), color)
    parts[#parts + 1] = table.concat(marks)
    legend[#legend + 1] = ('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/><text x="%d" y="%d">%s</text>'):format(
      L + pw + 10, T + 6 + 14 * (k - 1), L + pw + 26, T + 6 + 14 * (k - 1), color, L + pw + 30, T + 10 + 14 * (k - 1), esc(s[1]))
  end
  legend[#legend + 1] = '</g>'
  parts[#parts + 1] = table.concat(legend)
  local xs_sorted = {}
  for v in pairs(by_x) do xs_sorted[#xs_sorted + 1] = v end
  table.sort(xs_sorted)
  local stride = math.max(1, math.ceil(#xs_sorted / 200))
  for i, v in ipairs(xs_sorted) do
    if i % stride == 0 or i == 1 or i == #xs_sorted then
      local r = {v}
      for k = 1, #series do r[k + 1] = by_x[v][k] end
      rows[#rows + 1] = r
    end
  end
  local head = {opts.xlabel or 'step'}
  for k, s in ipairs(series) do head[k + 1] = s[1] end
  return figure{title = title, kind = 'lines', points = points, w = W, h = H, body = table.concat(parts), note = opts.note,
    head = head, table = rows}
end

-- charts.line_chart{title, xlabel, ylabel, series = {{name, xs, ys}, ...}} ->
-- a standalone SVG document: the x axis has one tick per distinct x (placed
-- evenly: sweeps are grids), the y axis round-number ticks over the data's
-- range (not from 0), a legend, and every point labelled with its value.
function charts.line_chart(spec)
  local CW, CH, L, R, T, B = 640, 360, 64, 150, 34, 48
  local xs_set, ys_all = {}, {}
  for _, s in ipairs(spec.series) do
    for i = 1, #s[2] do
      xs_set[s[2][i]] = true
      if finite(s[3][i]) then ys_all[#ys_all + 1] = s[3][i] end
    end
  end
  local xs = {}
  for x in pairs(xs_set) do xs[#xs + 1] = x end
  table.sort(xs, function(a, b)
    if type(a) == type(b) then return a < b end
    return tostring(a) < tostring(b)
  end)
  local xpos = {}
  local pw, ph = CW - L - R, CH - T - B
  for i, x in ipairs(xs) do xpos[x] = L + 24 + (#xs == 1 and (pw - 48) / 2 or (i - 1) / (#xs - 1) * (pw - 48)) end
  local ylo, yhi = range(ys_all)
  local pad = (yhi - ylo) * 0.08
  ylo, yhi = ylo - pad, yhi + pad
  local function ypos(v) return T + ph - (v - ylo) / (yhi - ylo) * ph end
  local parts = {
    ('<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 %d %d" width="%d" height="%d" font-family="sans-serif" font-size="11">'):format(CW, CH, CW, CH),
    ('<rect width="%d" height="%d" fill="white"/>'):format(CW, CH),
    ('<text x="%d" y="18" font-size="13" font-weight="bold">%s</text>'):format(L, esc(spec.title or '')),
    ('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#999"/>'):format(L, T + ph, L + pw, T + ph),
    ('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#999"/>'):format(L, T, L, T + ph),
  }
  for _, v in ipairs(nice_ticks(ylo, yhi, 5)) do
    local y = num(ypos(v))
    parts[#parts + 1] = ('<line x1="%d" y1="%s" x2="%d" y2="%s" stroke="#eee"/><text x="%d" y="%s" text-anchor="end" dy="4" fill="#555">%s</text>')
      :format(L, y, L + pw, y, L - 6, y, format.number(v))
  end
  for _, x in ipairs(xs) do
    parts[#parts + 1] = ('<line x1="%s" y1="%d" x2="%s" y2="%d" stroke="#999"/><text x="%s" y="%d" text-anchor="middle" fill="#555">%s</text>')
      :format(num(xpos[x]), T + ph, num(xpos[x]), T + ph + 5, num(xpos[x]), T + ph + 18, esc(tostring(x)))
  end
  parts[#parts + 1] = ('<text x="%s" y="%d" text-anchor="middle" fill="#333">%s</text>'):format(num(L + pw / 2), CH - 8, esc(spec.xlabel or ''))
  parts[#parts + 1] = ('<text transform="translate(14,%s) rotate(-90)" text-anchor="middle" fill="#333">%s</text>'):format(num(T + ph / 2), esc(spec.ylabel or ''))
  local points = 0
  for k, s in ipairs(spec.series) do
    local color = palette[(k - 1) % #palette + 1]
    local coords = {}
    for i = 1, #s[2] do
      local v = s[3][i]
      if finite(v) then
        points = points + 1
        local px, py = num(xpos[s[2][i]]), num(ypos(v))
        coords[#coords + 1] = px .. ',' .. py
        parts[#parts + 1] = ('<circle cx="%s" cy="%s" r="3" fill="%s"><title>%s, %s: %s</title></circle><text x="%s" y="%s" dy="-6" text-anchor="middle" fill="%s" font-size="9">%s</text>')
          :format(px, py, color, esc(s[1]), esc(tostring(s[2][i])), format.number(v), px, py, color, format.number(v))
      end
    end
    parts[#parts + 1] = ('<polyline points="%s" fill="none" stroke="%s" stroke-width="1.5"/>'):format(table.concat(coords, ' '), color)
    parts[#parts + 1] = ('<text x="%d" y="%d" fill="%s">%s</text>'):format(L + pw + 12, T + 12 + 16 * (k - 1), color, esc(s[1]))
  end
  parts[1] = parts[1]:gsub('class="chart"', ('class="chart" data-points="%d"'):format(points))
  parts[#parts + 1] = '</svg>'
  return table.concat(parts)
end

return charts
