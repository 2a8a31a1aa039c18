-- charts: inline SVG charts for the HTML reports (bars, lines, heatmaps,
-- attention thumbnails, and standalone line charts for sweeps). Every chart
-- carries data-points (how many values it draws), so a test can see that it
-- has data. No scripts, nothing fetched.
local format = require('anatomy.render.format')
local terminal = require('anatomy.render.terminal')
local charts = {}

local palette = {'#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2', '#17becf'}

-- charts.esc(s): s with &, <, > and " escaped for HTML and SVG
local function esc(s)
  return (tostring(s):gsub('[&<>"]', {['&'] = '&amp;', ['<'] = '&lt;', ['>'] = '&gt;', ['"'] = '&quot;'}))
end
charts.esc = esc

local function num(v) return ('%.2f'):format(v) end

local function finite(v) return type(v) == 'number' and v == v and v ~= math.huge and v ~= -math.huge end

local function range(values)
  local lo, hi = math.huge, -math.huge
  for _, v in ipairs(values) do
    if finite(v) then lo, hi = math.min(lo, v), math.max(hi, v) end
  end
  if lo == math.huge then return 0, 1 end
  if lo == hi then return lo - 0.5, hi + 0.5 end
  return lo, hi
end

-- Tick values for [lo, hi]: about n round numbers (1, 2 or 5 times a power of ten) inside it.
-- At least three whenever the range is not a single value (a narrow range
-- such as 0.246..0.254 took one tick, 0.25, before): the step shrinks
-- through the 1-2-5 sequence until three fit.
local function nice_ticks(lo, hi, n)
  local span = hi - lo
  if span <= 0 then return {lo} end
  local raw = span / (n or 5)
  local mag = 10 ^ math.floor(math.log10(raw))
  local steps = {}
  for e = 1, -2, -1 do
    for _, m in ipairs{10, 5, 2} do steps[#steps + 1] = m * mag * 10 ^ (e - 1) end
  end
  local chosen = 1
  for i = #steps, 1, -1 do
    if steps[i] >= raw * (1 - 1e-9) then chosen = i break end
  end
  local ticks
  for i = chosen, #steps do
    local step = steps[i]
    ticks = {}
    local first = math.ceil(lo / step - 1e-9)
    for k = first, math.floor(hi / step + 1e-9) do ticks[#ticks + 1] = k * step end
    if #ticks >= math.min(3, n or 5) then break end
  end
  return ticks
end
charts.nice_ticks = nice_ticks

-- A tick's label: as many decimals as the tick step needs (10, 20, 30 for
-- steps; 2.36, 2.37 for losses), scientific for very large or small values.
local function tick_text(v, ticks)
  local step = #ticks > 1 and math.abs(ticks[2] - ticks[1]) or math.abs(v)
  if v ~= 0 and (math.abs(v) >= 1e6 or math.abs(v) < 1e-4) then return ('%.2g'):format(v) end
  if step == 0 then return ('%g'):format(v) end
  local decimals = -math.floor(math.log10(step) + 1e-9)
  if decimals <= 0 then decimals = 0 end  -- (and never -0, which would print as "%.-0f")
  local t = ('%.' .. decimals .. 'f'):format(v)
  if t:match('^%-0%.?0*$') then t = t:sub(2) end
  return t
end

-- ---- the parts every chart shares ---------------------------------------------
-- Every chart is a <figure>: its caption, the SVG (class "chart", with
-- data-points: how many values it draws, and data-kind), an optional note,
-- and the numbers it draws as a table under it (a <details>, closed). Inside
-- the SVG the parts a reader needs carry classes a test can count: xtick,
-- ytick (tick labels), xlabel, ylabel (axis titles), legend, colorbar,
-- rowlabel (one per heatmap row).

local function numbers_table(head, rows)
  if not rows or #rows == 0 then return '' end
  local out = {'<details class="numbers"><summary>numbers</summary><table><thead><tr>'}
  for _, h in ipairs(head) do out[#out + 1] = '<th>' .. esc(h) .. '</th>' end
  out[#out + 1] = '</tr></thead><tbody>'
  for _, r in ipairs(rows) do
    out[#out + 1] = '<tr>'
    for _, v in ipairs(r) do out[#out + 1] = '<td>' .. esc(type(v) == 'number' and format.number(v, 4) or tostring(v or '')) .. '</td>' end
    out[#out + 1] = '</tr>'
  end
  out[#out + 1] = '</tbody></table></details>'
  return table.concat(out)
end

local function figure(spec)
  local attrs = {('data-kind="%s" data-points="%d"'):format(spec.kind, spec.points)}
  if spec.rows then attrs[#attrs + 1] = ('data-rows="%d"'):format(spec.rows) end
  -- bars of differences: the value they are differences from
  if spec.offset then attrs[#attrs + 1] = ('data-offset="%.9g"'):format(spec.offset) end
  local svg = ('<svg class="chart" %s viewBox="0 0 %d %d" width="%d" height="%d">%s</svg>'):format(
    table.concat(attrs, ' '), spec.w, spec.h, spec.w, spec.h, spec.body)
  if spec.scroll then svg = '<div class="scroll">' .. svg .. '</div>' end
  return ('<figure><figcaption>%s</figcaption>%s%s%s</figure>'):format(esc(spec.title), svg,
    spec.note and ('<p class="note">' .. esc(spec.note) .. '</p>') or '', numbers_table(spec.head or {}, spec.table))
end

-- The y axis: round-number ticks over [lo, hi] with grid lines, and its title.
local function y_axis(parts, lo, hi, L, T, pw, ph, label)
  local function y(v) return T + ph - (v - lo) / (hi - lo) * ph end
  local ticks = nice_ticks(lo, hi, 5)
  for _, v in ipairs(ticks) do
    parts[#parts + 1] = ('<line x1="%d" y1="%s" x2="%d" y2="%s" class="grid"/><text x="%d" y="%s" class="ytick" text-anchor="end" dy="3">%s</text>')
      :format(L, num(y(v)), L + pw, num(y(v)), L - 5, num(y(v)), tick_text(v, ticks))
  end
  parts[#parts + 1] = ('<line x1="%d" y1="%d" x2="%d" y2="%d" class="axis"/>'):format(L, T, L, T + ph)
  parts[#parts + 1] = ('<text transform="translate(12,%s) rotate(-90)" class="ylabel" text-anchor="middle">%s</text>'):format(num(T + ph / 2), esc(label or 'value'))
  return y
end

-- The range a value axis covers: from 0 unless every value is positive and
-- they differ by little beside their size (losses of 2.371..2.378), where a
-- bar from 0 would hide the differences; then from just below the smallest.
local function value_range(values, extra)
  local lo, hi = math.huge, -math.huge
  for _, v in pairs(values) do if finite(v) then lo, hi = math.min(lo, v), math.max(hi, v) end end
  for _, v in ipairs(extra or {}) do if finite(v) then lo, hi = math.min(lo, v), math.max(hi, v) end end
  if lo == math.huge then return 0, 1, false end
  if lo > 0 and hi > lo and (hi - lo) < 0.5 * hi then
    local pad = (hi - lo) * 0.15
    return lo - pad, hi + pad * 0.5, true
  end
  lo, hi = math.min(lo, 0), math.max(hi, 0)
  if lo == hi then hi = lo + 1 end
  return lo, hi + (hi - lo) * 0.05, false
end

local function longest(labels)
  local n = 0
  for _, l in ipairs(labels) do n = math.max(n, #tostring(l)) end
  return n
end

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
-- from it; recorded on the chart). The value axis starts where the data
-- does when the values differ by little beside their size (the note says so).
function charts.bars(title, labels, values, opts)
  if type(opts) ~= 'table' then opts = {note = opts} end
  local ref = opts.reference
  local lo, hi, from_data = value_range(values, ref and {ref[1]} or nil)
  local n = #labels
  local rotate = n > 6 or longest(labels) > 10
  local B = rotate and math.min(150, 28 + math.floor(longest(labels) * 5.2)) or 40
  local W = math.max(560, 70 + n * 14)
  local L, T, R = 64, 14, 16
  local pw, ph = W - L - R, 170
  local H = T + ph + B
  local parts = {}
  local y = y_axis(parts, lo, hi, L, T, pw, ph, opts.ylabel)
  local base = from_data and lo or math.max(lo, math.min(0, hi))
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
  if from_data then
    note = (note and note .. '; ' or '') .. ('the value axis starts at %s, not 0, so that the differences show'):format(format.number(lo, 4))
  end
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
-- series), and the numbers are in a table under the chart.
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

-- A colour for t in [0, 1]: blue (low) through pale to red (high).
local function diverging(t)
  t = math.min(math.max(t, 0), 1)
  if t < 0.5 then
    local u = t * 2
    return ('rgb(%d,%d,%d)'):format(math.floor(49 + u * 198), math.floor(54 + u * 193), math.floor(149 + u * 98))
  end
  local u = (t - 0.5) * 2
  return ('rgb(%d,%d,%d)'):format(math.floor(247 - u * 32), math.floor(247 - u * 199), math.floor(247 - u * 208))
end

-- A vertical colour bar at (x, y) of height h for [lo, hi] (labels 10^v when log).
local function colorbar(parts, x, y, h, lo, hi, log, label)
  parts[#parts + 1] = '<g class="colorbar">'
  for i = 0, 19 do
    parts[#parts + 1] = ('<rect x="%d" y="%s" width="12" height="%s" fill="%s"/>'):format(x, num(y + (19 - i) * h / 20), num(h / 20 + 0.5), diverging(i / 19))
  end
  local ticks = nice_ticks(lo, hi, 4)
  if log then  -- whole powers of ten where the range has them
    local whole = {}
    for p = math.ceil(lo), math.floor(hi) do whole[#whole + 1] = p end
    if #whole >= 2 then ticks = whole end
  end
  for _, v in ipairs(ticks) do
    local ty = y + h - (v - lo) / (hi - lo) * h
    parts[#parts + 1] = ('<line x1="%d" y1="%s" x2="%d" y2="%s" class="axis"/><text x="%d" y="%s" class="ytick" dy="3">%s</text>'):format(
      x + 12, num(ty), x + 15, num(ty), x + 17, num(ty), log and ('%.3g'):format(10 ^ v) or tick_text(v, ticks))
  end
  if label then
    parts[#parts + 1] = ('<text transform="translate(%d,%s) rotate(-90)" class="ylabel" text-anchor="middle">%s</text>'):format(x + 62, num(y + h / 2), esc(label))
  end
  parts[#parts + 1] = '</g>'
end

-- charts.heatmap(title, row_labels, col_labels, matrix, log, opts): rows x
-- cols of values, every row labelled (the full names; a line between groups
-- of rows whose names share their first two parts, as blocks.2.*), the
-- columns labelled, a colour bar with its ticks (log10 colour when log).
-- Tall maps scroll. opts: note, xlabel, value (what the colour is).
function charts.heatmap(title, row_labels, col_labels, matrix, log, opts)
  if type(opts) ~= 'table' then opts = {note = opts} end
  local flat = {}
  for _, row in ipairs(matrix) do for _, v in ipairs(row) do flat[#flat + 1] = log and finite(v) and v > 0 and math.log10(v) or (not log and v or nil) end end
  local lo, hi = range(flat)
  local nr, nc = #row_labels, #col_labels
  local L = math.min(300, 12 + math.floor(longest(row_labels) * 6.2))
  local rh = 14
  local cw = math.max(10, math.min(60, math.floor(480 / math.max(nc, 1))))
  local rotate = nc > 8 or longest(col_labels) * 6 > cw
  local T = rotate and math.min(110, 14 + math.floor(longest(col_labels) * 5)) or 24
  local W = L + nc * cw + 110
  local H = T + nr * rh + 30
  local parts, points, rows = {}, 0, {}
  local zeros, missing = false, false
  local function group(name) return tostring(name):match('^([^.]+%.[^.]+)%.') or tostring(name):match('^([^.]+)') end
  for c = 1, nc do
    local cx = L + (c - 0.5) * cw
    if rotate then
      parts[#parts + 1] = ('<text transform="translate(%s,%d) rotate(-60)" class="xtick">%s</text>'):format(num(cx), T - 4, esc(col_labels[c]))
    else
      parts[#parts + 1] = ('<text x="%s" y="%d" class="xtick" text-anchor="middle">%s</text>'):format(num(cx), T - 6, esc(col_labels[c]))
    end
  end
  for r = 1, nr do
    local ry = T + (r - 1) * rh
    if r > 1 and group(row_labels[r]) ~= group(row_labels[r - 1]) then
      parts[#parts + 1] = ('<line x1="0" y1="%d" x2="%d" y2="%d" class="group"/>'):format(ry, L + nc * cw, ry)
    end
    parts[#parts + 1] = ('<text x="%d" y="%d" class="rowlabel" text-anchor="end">%s</text>'):format(L - 4, ry + rh - 3, esc(row_labels[r]))
    local row = {row_labels[r]}
    for c = 1, nc do
      local v = matrix[r] and matrix[r][c]
      row[c + 1] = v
      local s = log and finite(v) and v > 0 and math.log10(v) or (not log and v or nil)
      local cx = L + (c - 1) * cw
      if finite(s) then
        points = points + 1
        parts[#parts + 1] = ('<rect x="%s" y="%d" width="%d" height="%d" fill="%s"><title>%s, %s: %s</title></rect>'):format(
          num(cx), ry, cw, rh, diverging((s - lo) / (hi - lo)), esc(row_labels[r]), esc(col_labels[c]), format.number(v, 4))
      elseif log and v == 0 then  -- a zero has no place on a log scale: white, marked 0 (not the colour of a small value)
        zeros = true
        parts[#parts + 1] = ('<rect x="%s" y="%d" width="%d" height="%d" class="zero" fill="#ffffff" stroke="#999999"><title>%s, %s: 0</title></rect>'
          .. '<text x="%s" y="%d" class="zero" text-anchor="middle" fill="#666666" font-size="9">0</text>'):format(
          num(cx), ry, cw, rh, esc(row_labels[r]), esc(col_labels[c]), num(cx + cw / 2), ry + rh - 4)
      else  -- no value (nil, NaN, a negative on a log scale): grey, crossed
        missing = true
        parts[#parts + 1] = ('<rect x="%s" y="%d" width="%d" height="%d" class="missing" fill="#e4e4e4"><title>%s, %s: no value</title></rect>'
          .. '<line x1="%s" y1="%d" x2="%s" y2="%d" class="missing" stroke="#aaaaaa"/>'):format(
          num(cx), ry, cw, rh, esc(row_labels[r]), esc(col_labels[c]), num(cx), ry + rh, num(cx + cw), ry)
      end
    end
    rows[#rows + 1] = row
  end
  parts[#parts + 1] = ('<text x="%s" y="%d" class="xlabel" text-anchor="middle">%s</text>'):format(num(L + nc * cw / 2), H - 6, esc(opts.xlabel or ''))
  parts[#parts + 1] = ('<text x="4" y="%d" class="ylabel">%s</text>'):format(math.max(10, T - 8), esc(opts.ylabel or ''))
  local bar_h = math.max(nr * rh, 80)
  colorbar(parts, L + nc * cw + 14, T, bar_h, lo, hi, log, opts.value or 'value')
  -- what the cells without a colour mean, under the colour bar
  local key_y = T + bar_h + 14
  if zeros then
    parts[#parts + 1] = ('<g class="cellkey"><rect x="%d" y="%d" width="10" height="10" fill="#ffffff" stroke="#999999"/><text x="%d" y="%d">0</text></g>')
      :format(L + nc * cw + 14, key_y, L + nc * cw + 28, key_y + 9)
    key_y = key_y + 14
  end
  if missing then
    parts[#parts + 1] = ('<g class="cellkey"><rect x="%d" y="%d" width="10" height="10" fill="#e4e4e4"/><line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#aaaaaa"/><text x="%d" y="%d">no value</text></g>')
      :format(L + nc * cw + 14, key_y, L + nc * cw + 14, key_y + 10, L + nc * cw + 24, key_y, L + nc * cw + 28, key_y + 9)
    key_y = key_y + 14
  end
  H = math.max(H, key_y + 6)
  local head = {opts.ylabel or ''}
  for c = 1, nc do head[c + 1] = col_labels[c] end
  return figure{title = title, kind = 'heatmap', points = points, rows = nr, w = W, h = math.max(H, T + 110), body = table.concat(parts),
    note = opts.note, head = head, table = rows, scroll = nr * rh > 560}
end

-- charts.attention_map(title, tokens, m, note): one head's pattern (a (T, T)
-- list of lists) with the tokens on both axes (queries down, keys across),
-- each cell shaded by its weight and titled "query -> key: weight", and a
-- colour bar from 0 to 1.
function charts.attention_map(title, tokens, m, note)
  local T = #m
  local cell = math.max(12, math.min(22, math.floor(520 / math.max(T, 1))))
  local left, top = 100, 90
  local w, h = left + T * cell + 80, top + T * cell + 36
  local parts, points = {}, 0
  local function label(s) return terminal.token_label(s or '', 12) end
  for r = 1, T do
    parts[#parts + 1] = ('<text x="%d" y="%s" class="rowlabel" text-anchor="end">%s</text>'):format(left - 4,
      num(top + (r - 0.5) * cell + 3), esc(label(tokens[r])))
    parts[#parts + 1] = ('<text transform="translate(%s,%d) rotate(-60)" class="xtick">%s</text>'):format(
      num(left + (r - 0.5) * cell + 3), top - 4, esc(label(tokens[r])))
    for c = 1, T do
      local v = m[r][c]
      if finite(v) then
        points = points + 1
        local shade = math.floor(255 * (1 - math.min(math.max(v, 0), 1)))
        parts[#parts + 1] = ('<rect x="%s" y="%s" width="%d" height="%d" fill="rgb(%d,%d,255)"><title>%s -&gt; %s: %s</title></rect>'):format(
          num(left + (c - 1) * cell), num(top + (r - 1) * cell), cell, cell, shade, shade, esc(label(tokens[r])),
          esc(label(tokens[c])), format.number(v))
      end
    end
  end
  parts[#parts + 1] = ('<text x="%s" y="%d" class="xlabel" text-anchor="middle">key (attended to)</text>'):format(num(left + T * cell / 2), h - 8)
  parts[#parts + 1] = ('<text transform="translate(12,%s) rotate(-90)" class="ylabel" text-anchor="middle">query</text>'):format(num(top + T * cell / 2))
  local sx = left + T * cell + 14
  parts[#parts + 1] = '<g class="colorbar">'
  for i = 0, 9 do
    local shade = math.floor(255 * (1 - i / 9))
    parts[#parts + 1] = ('<rect x="%d" y="%s" width="12" height="%s" fill="rgb(%d,%d,255)"/>'):format(sx,
      num(top + (9 - i) * T * cell / 10), num(T * cell / 10 + 0.5), shade, shade)
  end
  for _, v in ipairs{0, 0.5, 1} do
    parts[#parts + 1] = ('<text x="%d" y="%s" class="ytick" dy="3">%s</text>'):format(sx + 16, num(top + (1 - v) * T * cell), format.number(v))
  end
  parts[#parts + 1] = '</g>'
  return figure{title = title, kind = 'attention', points = points, rows = T, w = w, h = h, body = table.concat(parts), note = note}
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
