-- What every SVG chart shares (render/charts.lua, render/heatmap.lua): the
-- palette, escaping, number and tick formatting, axes, and the <figure> with
-- its numbers table under it, so that a chart and its table come from the
-- same data.
local format = require('anatomy.render.format')
local svg = {}

local palette = {'#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2', '#17becf'}

-- svg.esc(s): s with &, <, > and " escaped for HTML and SVG
local function esc(s)
  return (tostring(s):gsub('[&<>"]', {['&'] = '&amp;', ['<'] = '&lt;', ['>'] = '&gt;', ['"'] = '&quot;'}))
end
svg.esc = esc

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
svg.nice_ticks = nice_ticks

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
-- line from 0 would hide the differences; then from just below the
-- smallest. With zero (bars: their length is the value, and a bar from an
-- axis near the smallest value makes 0.81 look a sixth of 1.33), always
-- from 0.
local function value_range(values, extra, zero)
  local lo, hi = math.huge, -math.huge
  for _, v in pairs(values) do if finite(v) then lo, hi = math.min(lo, v), math.max(hi, v) end end
  for _, v in ipairs(extra or {}) do if finite(v) then lo, hi = math.min(lo, v), math.max(hi, v) end end
  if lo == math.huge then return 0, 1, false end
  if not zero and lo > 0 and hi > lo and (hi - lo) < 0.5 * hi then
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

svg.palette = palette
svg.num = num
svg.finite = finite
svg.range = range
svg.tick_text = tick_text
svg.numbers_table = numbers_table
svg.figure = figure
svg.y_axis = y_axis
svg.value_range = value_range
svg.longest = longest

return svg
