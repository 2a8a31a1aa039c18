-- Charts on a grid of cells (render/charts.lua's heatmap and attention_map):
-- a diverging colour scale with its colour bar, rows and columns labelled,
-- every cell titled with its value and the numbers in a table under it.
local format = require('anatomy.render.format')
local terminal = require('anatomy.render.terminal')
local svg = require('anatomy.render.svg')
local heatmap = {}

local esc = svg.esc
local num = svg.num
local finite = svg.finite
local range = svg.range
local nice_ticks = svg.nice_ticks
local tick_text = svg.tick_text
local figure = svg.figure
local longest = svg.longest

-- The longest cell text (as terminal.token_label shows it), capped at 10.
local function longest_cell(labels)
  local n = 0
  for _, row in pairs(labels) do
    for _, v in pairs(row) do n = math.max(n, #terminal.token_label(tostring(v), 10)) end
  end
  return n
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
-- Tall maps scroll. opts: note, xlabel, ylabel, value (what the colour is),
-- labels ([row][column] a text written in each cell, and in its title),
-- range ({low, high}: the colour scale's ends instead of the values' own;
-- values outside take the end colours). Values of both signs get a scale
-- symmetric about 0, so that the pale middle colour is 0 and blue is
-- below it (a patching grid's negative shares); one sign alone spans the
-- values' own range.
function heatmap.heatmap(title, row_labels, col_labels, matrix, log, opts)
  if type(opts) ~= 'table' then opts = {note = opts} end
  local flat = {}
  for _, row in ipairs(matrix) do for _, v in ipairs(row) do flat[#flat + 1] = log and finite(v) and v > 0 and math.log10(v) or (not log and v or nil) end end
  local lo, hi = range(flat)
  if not log and lo < 0 and hi > 0 then
    local m = math.max(-lo, hi)
    lo, hi = -m, m
  end
  if opts.range then  -- a colour scale shared with another chart (two lenses' tables side by side)
    local r = opts.range
    lo, hi = log and math.log10(r[1]) or r[1], log and math.log10(r[2]) or r[2]
    if not (finite(lo) and finite(hi) and hi > lo) then error(('heatmap: range must be two finite numbers, low < high, got %s, %s'):format(tostring(r[1]), tostring(r[2])), 2) end
  end
  local nr, nc = #row_labels, #col_labels
  local L = math.min(300, 12 + math.floor(longest(row_labels) * 6.2))
  local rh = opts.labels and 18 or 14
  local cw = math.max(10, math.min(60, math.floor(480 / math.max(nc, 1))))
  local labels = opts.labels  -- a text written in each cell (a lens table's top token)
  if labels then cw = math.max(cw, math.min(64, 10 + 6 * longest_cell(labels))) end
  local rotate = nc > 8 or longest(col_labels) * 6 > cw
  local T = rotate and math.min(110, 14 + math.floor(longest(col_labels) * 5)) or 24
  local ylabel = opts.ylabel and opts.ylabel ~= ''
  if ylabel then T = T + 16 end  -- the row axis's name on a line of its own, above the column labels
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
        local text = labels and labels[r] and labels[r][c]
        parts[#parts + 1] = ('<rect x="%s" y="%d" width="%d" height="%d" fill="%s"><title>%s, %s: %s%s</title></rect>'):format(
          num(cx), ry, cw, rh, diverging((s - lo) / (hi - lo)), esc(row_labels[r]), esc(col_labels[c]), format.number(v, 4),
          text and (' (' .. esc(terminal.token_label(text, 24)) .. ')') or '')
        if text then  -- light on the scale's dark ends, dark in between
          local t = (s - lo) / (hi - lo)
          parts[#parts + 1] = ('<text x="%s" y="%d" class="cell" text-anchor="middle" font-size="10" fill="%s">%s</text>'):format(
            num(cx + cw / 2), ry + rh - 5, (t < 0.3 or t > 0.85) and '#ffffff' or '#222222',
            esc(terminal.token_label(text, math.floor((cw - 4) / 6))))
        end
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
  if ylabel then parts[#parts + 1] = ('<text x="4" y="12" class="ylabel">%s</text>'):format(esc(opts.ylabel)) end
  local bar_h = math.max(nr * rh, 80)
  colorbar(parts, L + nc * cw + 14, T, bar_h, lo, hi, log, opts.value or 'value')
  -- what the cells without a colour mean, under the colour bar
  local key_y = T + bar_h + 14
  if zeros then
    parts[#parts + 1] = ('<g class="cellkey"><rect x="%d" y="%d" width="10" height="10" fill="#ffffff" stroke="#999999"/><text x="%d" y="%d" font-size="11" fill="#444444">0</text></g>')
      :format(L + nc * cw + 14, key_y, L + nc * cw + 28, key_y + 9)
    key_y = key_y + 14
  end
  if missing then
    parts[#parts + 1] = ('<g class="cellkey"><rect x="%d" y="%d" width="10" height="10" fill="#e4e4e4"/><line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#aaaaaa"/><text x="%d" y="%d" font-size="11" fill="#444444">no value</text></g>')
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
function heatmap.attention_map(title, tokens, m, note)
  local T = #m
  local cell = math.max(12, math.min(22, math.floor(520 / math.max(T, 1))))
  local left, top = 100, 90
  local w, h = left + T * cell + 80, top + T * cell + 36
  local parts, points = {}, 0
  local function label(s) return terminal.token_label(s or '', 12) end
  -- the tokens as large as a cell allows (12 to 15 px): read at a glance, not zoomed into
  local fs = math.max(12, math.min(15, cell - 3))
  for r = 1, T do
    parts[#parts + 1] = ('<text x="%d" y="%s" class="rowlabel" text-anchor="end" style="font-size:%dpx;fill:#222">%s</text>'):format(left - 4,
      num(top + (r - 0.5) * cell + fs / 3), fs, esc(label(tokens[r])))
    parts[#parts + 1] = ('<text transform="translate(%s,%d) rotate(-60)" class="xtick" style="font-size:%dpx;fill:#222">%s</text>'):format(
      num(left + (r - 0.5) * cell + fs / 3), top - 4, fs, esc(label(tokens[r])))
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

return heatmap
