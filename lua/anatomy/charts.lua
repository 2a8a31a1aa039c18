-- charts: inline SVG charts for the HTML reports (bars, lines, heatmaps,
-- attention thumbnails, and standalone line charts for sweeps). Every chart
-- carries data-points (how many values it draws), so a test can see that it
-- has data. No scripts, nothing fetched.
local format = require 'anatomy.autopsy.format'
local charts = {}

local W, H, PAD = 560, 220, 42
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

local function figure(title, body, points, note)
  return ('<figure><figcaption>%s</figcaption><svg class="chart" data-points="%d" viewBox="0 0 %d %d" width="%d" height="%d">%s</svg>%s</figure>')
    :format(esc(title), points, W, H, W, H, body, note and ('<p class="note">' .. esc(note) .. '</p>') or '')
end

local function axes(lo, hi)
  return ('<line x1="%d" y1="%d" x2="%d" y2="%d" class="axis"/><line x1="%d" y1="%d" x2="%d" y2="%d" class="axis"/>'
    .. '<text x="4" y="%d" class="tick">%s</text><text x="4" y="%d" class="tick">%s</text>')
    :format(PAD, 10, PAD, H - 24, PAD, H - 24, W - 8, H - 24, 16, format.number(hi), H - 26, format.number(lo))
end

-- Bars, one per label.
function charts.bars(title, labels, values, note)
  local lo, hi = range(values)
  lo = math.min(lo, 0)
  local n, points = #labels, 0
  local bw = (W - PAD - 10) / math.max(n, 1)
  local parts = {axes(lo, hi)}
  for i, v in ipairs(values) do
    if finite(v) then
      points = points + 1
      local h = (v - lo) / (hi - lo) * (H - 40)
      parts[#parts + 1] = ('<rect x="%s" y="%s" width="%s" height="%s" fill="%s"><title>%s: %s</title></rect>'):format(
        num(PAD + (i - 1) * bw + 2), num(H - 24 - h), num(math.max(bw - 4, 1)), num(h), palette[1], esc(labels[i]), format.number(v))
    end
    if n <= 12 then
      parts[#parts + 1] = ('<text x="%s" y="%d" class="label">%s</text>'):format(num(PAD + (i - 0.5) * bw), H - 8, esc(labels[i]:match('[^.]*$')))
    end
  end
  return figure(title, table.concat(parts), points, note)
end

-- charts.signed_bars(title, labels, values, note): bars from a zero line,
-- up (blue) for positive values and down (red) for negative ones, each
-- labelled below (rotated) and titled with its value; the axis marks the
-- largest value on each side.
function charts.signed_bars(title, labels, values, note)
  local hi, lo = 0, 0
  for _, v in ipairs(values) do
    if finite(v) then hi, lo = math.max(hi, v), math.min(lo, v) end
  end
  if hi == lo then hi = 1 end
  local n, points = #labels, 0
  local top, bottom = 16, H - 70
  local zero = top + (hi / (hi - lo)) * (bottom - top)
  local bw = (W - PAD - 10) / math.max(n, 1)
  local parts = {('<line x1="%d" y1="%s" x2="%d" y2="%s" class="axis"/><text x="4" y="%d" class="tick">%s</text>'
    .. '<text x="4" y="%s" class="tick">0</text><text x="4" y="%d" class="tick">%s</text>'):format(PAD, num(zero), W - 8, num(zero),
    top + 4, format.number(hi), num(zero + 3), bottom, format.number(lo))}
  for i, v in ipairs(values) do
    if finite(v) then
      points = points + 1
      local y1 = top + ((hi - math.max(v, 0)) / (hi - lo)) * (bottom - top)
      local y2 = top + ((hi - math.min(v, 0)) / (hi - lo)) * (bottom - top)
      parts[#parts + 1] = ('<rect x="%s" y="%s" width="%s" height="%s" fill="%s"><title>%s: %s</title></rect>'):format(
        num(PAD + (i - 1) * bw + 1), num(y1), num(math.max(bw - 2, 1)), num(math.max(y2 - y1, 0.5)),
        v >= 0 and palette[1] or palette[2], esc(labels[i]), format.number(v))
    end
    if n <= 60 then
      parts[#parts + 1] = ('<text transform="translate(%s,%d) rotate(-60)" class="label-left" text-anchor="end">%s</text>'):format(
        num(PAD + (i - 0.5) * bw + 3), bottom + 12, esc(labels[i]))
    end
  end
  return figure(title, table.concat(parts), points, note)
end

-- Lines: series = {{name, xs, ys}, ...}
function charts.lines(title, series, note)
  local xs_all, ys_all = {}, {}
  for _, s in ipairs(series) do
    for i = 1, #s[2] do xs_all[#xs_all + 1] = s[2][i]; ys_all[#ys_all + 1] = s[3][i] end
  end
  local xlo, xhi = range(xs_all)
  local ylo, yhi = range(ys_all)
  local parts, points = {axes(ylo, yhi)}, 0
  for k, s in ipairs(series) do
    local coords = {}
    for i = 1, #s[2] do
      if finite(s[3][i]) then
        coords[#coords + 1] = num(PAD + (s[2][i] - xlo) / (xhi - xlo) * (W - PAD - 10)) .. ',' .. num(H - 24 - (s[3][i] - ylo) / (yhi - ylo) * (H - 40))
        points = points + 1
      end
    end
    local color = palette[(k - 1) % #palette + 1]
    parts[#parts + 1] = ('<polyline points="%s" fill="none" stroke="%s" stroke-width="1.5"/>'):format(table.concat(coords, ' '), color)
    parts[#parts + 1] = ('<text x="%d" y="%d" class="legend" fill="%s">%s</text>'):format(W - 150, 16 + 14 * (k - 1), color, esc(s[1]))
  end
  return figure(title, table.concat(parts), points, note)
end

-- A heatmap: rows x cols of values (log-scaled colour when log is set).
function charts.heatmap(title, row_labels, col_labels, matrix, log, note)
  local flat = {}
  for _, row in ipairs(matrix) do for _, v in ipairs(row) do flat[#flat + 1] = log and finite(v) and v > 0 and math.log10(v) or v end end
  local lo, hi = range(flat)
  local nr, nc = #row_labels, #col_labels
  local cw, ch = (W - 150) / math.max(nc, 1), (H - 20) / math.max(nr, 1)
  local parts, points = {}, 0
  for r = 1, nr do
    if nr <= 30 then
      parts[#parts + 1] = ('<text x="2" y="%s" class="label-left">%s</text>'):format(num(10 + (r - 0.5) * ch + 3), esc(row_labels[r]))
    end
    for c = 1, nc do
      local v = matrix[r][c]
      local s = log and finite(v) and v > 0 and math.log10(v) or v
      if finite(s) then
        points = points + 1
        local t = (s - lo) / (hi - lo)
        parts[#parts + 1] = ('<rect x="%s" y="%s" width="%s" height="%s" fill="rgb(%d,%d,%d)"><title>%s @ %s: %s</title></rect>'):format(
          num(148 + (c - 1) * cw), num(10 + (r - 1) * ch), num(cw + 0.5), num(ch + 0.5),
          math.floor(255 * t), math.floor(80 + 100 * (1 - math.abs(t - 0.5) * 2)), math.floor(255 * (1 - t)),
          esc(row_labels[r]), esc(col_labels[c]), format.number(v))
      end
    end
  end
  return figure(title, table.concat(parts), points, note)
end

-- Small attention maps, one per layer: (T, T) matrices as lists.
function charts.thumbnails(title, labels, matrices)
  local parts, points = {}, 0
  local size = math.min(110, math.floor((W - 10) / math.max(#labels, 1)) - 6)
  for i, m in ipairs(matrices) do
    local T = #m
    local cell = size / math.max(T, 1)
    local x0 = 4 + (i - 1) * (size + 6)
    for r = 1, T do
      for c = 1, T do
        local v = m[r][c]
        points = points + 1
        local shade = math.floor(255 * (1 - math.min(math.max(v, 0), 1)))
        parts[#parts + 1] = ('<rect x="%s" y="%s" width="%s" height="%s" fill="rgb(%d,%d,255)"/>'):format(
          num(x0 + (c - 1) * cell), num(20 + (r - 1) * cell), num(cell + 0.2), num(cell + 0.2), shade, shade)
      end
    end
    parts[#parts + 1] = ('<text x="%s" y="14" class="label-left">%s</text>'):format(num(x0), esc(labels[i]))
  end
  return figure(title, table.concat(parts), points)
end

-- charts.attention_map(title, tokens, m, note): one head's pattern (a (T, T)
-- list of lists) with the tokens on both axes (query tokens down, key tokens
-- across), each cell shaded by its weight (0 white, 1 full blue) and titled
-- with "query -> key: weight", and a colour scale beside it.
function charts.attention_map(title, tokens, m, note)
  local T = #m
  local cell = math.max(8, math.min(18, math.floor(360 / math.max(T, 1))))
  local left, top = 90, 80
  local w, h = left + T * cell + 70, top + T * cell + 10
  local parts, points = {}, 0
  local function label(s) return require('anatomy.terminal').token_label(s or '', 10) end
  for r = 1, T do
    parts[#parts + 1] = ('<text x="%d" y="%s" class="label-left" text-anchor="end">%s</text>'):format(left - 4,
      num(top + (r - 0.5) * cell + 3), esc(label(tokens[r])))
    parts[#parts + 1] = ('<text transform="translate(%s,%d) rotate(-60)" class="label-left">%s</text>'):format(
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
  local sx = left + T * cell + 14
  for i = 0, 9 do
    local shade = math.floor(255 * (1 - i / 9))
    parts[#parts + 1] = ('<rect x="%d" y="%s" width="12" height="%s" fill="rgb(%d,%d,255)"/>'):format(sx,
      num(top + (9 - i) * T * cell / 10), num(T * cell / 10 + 0.5), shade, shade)
  end
  parts[#parts + 1] = ('<text x="%d" y="%d" class="tick">1</text><text x="%d" y="%d" class="tick">0</text>'):format(
    sx + 16, top + 8, sx + 16, top + T * cell)
  return ('<figure><figcaption>%s</figcaption><svg class="chart" data-points="%d" viewBox="0 0 %d %d" width="%d" height="%d">%s</svg>%s</figure>')
    :format(esc(title), points, w, h, w, h, table.concat(parts), note and ('<p class="note">' .. esc(note) .. '</p>') or '')
end

-- Tick values for [lo, hi]: about n round numbers (1, 2 or 5 times a power of ten) inside it.
local function nice_ticks(lo, hi, n)
  local span = hi - lo
  if span <= 0 then return {lo} end
  local raw = span / (n or 5)
  local mag = 10 ^ math.floor(math.log10(raw))
  local step = mag
  for _, m in ipairs{1, 2, 5, 10} do
    if m * mag >= raw then step = m * mag break end
  end
  local ticks = {}
  for v = math.ceil(lo / step) * step, hi + step * 1e-9, step do ticks[#ticks + 1] = v end
  return ticks
end
charts.nice_ticks = nice_ticks

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
