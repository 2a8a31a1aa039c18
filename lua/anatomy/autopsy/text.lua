-- The autopsy as text: the per-layer table with its legend and the
-- verdicts' rule, the parameter table, and terminal bar charts. Which
-- measures each shows comes from the registry (measures.lua).
local format = require('anatomy.render.format')
local measures = require('anatomy.autopsy.measures')
local moe = require('anatomy.autopsy.moe')
local text = {}

local fmt = format.number

-- text.columns(a) -> the registry entries a's table shows: every one that is
-- always there, and those shown when present where a row has them. The
-- terminal table, the HTML table and the legend use it.
function text.columns(a)
  local out = {}
  for _, m in ipairs(measures.rows) do
    local shown = m.table == 'always'
    for _, r in ipairs(m.table == 'present' and a.rows or {}) do shown = shown or r[m.name] ~= nil end
    if shown then out[#out + 1] = m end
  end
  return out
end

-- text.legend(a) -> lines: what each column measures, then the verdicts' rule.
function text.legend(a)
  local lines = {}
  local columns, width = text.columns(a), 14
  for _, m in ipairs(columns) do width = math.max(width, #m.name + 2) end
  for _, m in ipairs(columns) do lines[#lines + 1] = ('%-' .. width .. 's%s'):format(m.name, m.meaning) end
  local t = a.thresholds
  lines[#lines + 1] = ('verdicts: boundary = an input or output row with >= %g of the largest grad_norm while the median block has < %g; '
    .. 'passenger = residual < %g, grad_norm share < %g, or removal_loss - loss < %g of the loss (for a residual wrapper: '
    .. 'f_residual and f_removal_loss); exploding = amplification > %g in this block and the one before or after it '
    .. '(the stream\'s growth compounding)'):format(
    t.boundary, t.boundary_middle, t.passenger, t.passenger_grad, t.passenger_removal or 0, t.exploding)
  local experts = text.expert_rule(a)
  if experts then lines[#lines + 1] = experts end
  return lines
end

-- text.expert_rule(a) -> the experts' verdicts' rule (a model with an nn.MoE), or nil
function text.expert_rule(a)
  local t = a.thresholds
  if not (a.moe and t.passenger_expert) then return nil end
  return ('expert verdicts (a.moe.experts): dead = load <= %g (%s); passenger = removing it (the router as if it were not there) '
    .. 'raises the loss by < %g of the loss; else worker'):format(t.dead_expert,
    t.dead_expert == 0 and 'no token routed to it on these batches' or 'of the routed slots', t.passenger_expert)
end

-- The per-layer table.
function text.table(a)
  local cols = {{'layer', function(r) return r.name end}}
  for _, m in ipairs(text.columns(a)) do
    if m.terminal ~= false then cols[#cols + 1] = {m.name, function(r) return m.cell(r, fmt) end} end
  end
  local cells, widths = {}, {}
  for c, col in ipairs(cols) do widths[c] = #col[1] end
  for i, r in ipairs(a.rows) do
    cells[i] = {}
    for c, col in ipairs(cols) do
      cells[i][c] = col[2](r)
      widths[c] = math.max(widths[c], #cells[i][c])
    end
  end
  local function line(values)
    local parts = {}
    for c, v in ipairs(values) do parts[c] = c == 1 and v .. (' '):rep(widths[c] - #v) or (' '):rep(widths[c] - #v) .. v end
    return table.concat(parts, '  ')
  end
  local header = {}
  for c, col in ipairs(cols) do header[c] = col[1] end
  local out = {('autopsy of %s: loss %s'):format(a.model, fmt(a.loss, 4)), line(header)}
  out[#out + 1] = ('-'):rep(#out[2])
  for i in ipairs(a.rows) do out[#out + 1] = line(cells[i]) end
  local gates = {}
  for _, r in ipairs(a.rows) do
    if r.gate_grad then gates[#gates + 1] = ('%s gate_grad %s, gate_identity (|W - I|/sqrt(d)) %s'):format(r.name, fmt(r.gate_grad, 4), fmt(r.gate_identity)) end
  end
  if #gates > 0 then out[#out + 1] = 'gates: ' .. table.concat(gates, '; ') end
  local shown = {lens_loss = 'lens_loss', entropy = 'entropy and diag', removal_loss = 'removal_loss', sae_ce_recovered = 'sae_ce_recovered'}
  for _, key in ipairs{'entropy', 'lens_loss', 'removal_loss', 'sae_ce_recovered'} do
    if a.missing and a.missing[key] then out[#out + 1] = ('%s: - because %s'):format(shown[key], a.missing[key]) end
  end
  for _, l in ipairs(moe.lines(a)) do out[#out + 1] = l end
  if a.removal then
    out[#out + 1] = ('without the %d least influential blocks (%s): loss %s (full model %s)'):format(
      a.removal.k, table.concat(a.removal.blocks, ', '), fmt(a.removal.loss, 4), fmt(a.removal.full_loss, 4))
  end
  out[#out + 1] = ''
  for _, l in ipairs(text.legend(a)) do out[#out + 1] = l end
  out[#out + 1] = ''
  out[#out + 1] = text.parameter_table(a)
  return table.concat(out, '\n')
end

-- Each parameter's gradient norm and, for matrices, its effective rank.
function text.parameter_table(a)
  local ranks = {}
  for _, w in ipairs(a.weights) do ranks[w.name] = w end
  local width = 9
  for _, p in ipairs(a.params) do width = math.max(width, #p.name) end
  local lines = {('%-' .. width .. 's  %10s  %10s  %s'):format('parameter', 'shape', 'grad_norm', 'erank (of full)')}
  for _, p in ipairs(a.params) do
    local w = ranks[p.name]
    lines[#lines + 1] = ('%-' .. width .. 's  %10s  %10s  %s'):format(p.name, p.shape, fmt(p.grad_norm, 4),
      w and ('%s (%d%%)'):format(fmt(w.erank, 1), math.floor(100 * w.ratio + 0.5)) or '')
  end
  return table.concat(lines, '\n')
end

local bars = {' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'}

-- text.plot(a, metric, quiet) (a:plot(metric)): a compact chart of one
-- column per layer, in the terminal; the columns are the registry's plot ones.
-- Prints it unless quiet; returns the text.
function text.plot(a, metric, quiet)
  local columns = measures.where('plot')
  if metric ~= nil and not (measures.by_name[metric] or {}).plot then
    error(("bad argument #1 to 'plot' (unknown column '%s'; the columns are %s)"):format(tostring(metric), table.concat(columns, ', ')), 3)
  end
  metric = metric or 'grad_norm'
  local values, lo, hi = {}, math.huge, -math.huge
  for _, r in ipairs(a.rows) do
    local v = r[metric]
    values[#values + 1] = {r.name, v}
    if v and v == v then lo, hi = math.min(lo, v), math.max(hi, v) end
  end
  -- Bars start where the data does: when every value is positive and they
  -- differ by little beside their size (losses of 2.371..2.378), a bar from
  -- 0 would hide the differences; the baseline is then just below the smallest.
  local base = 0
  if lo > 0 and hi > lo and (hi - lo) < 0.5 * hi then base = lo - 0.05 * (hi - lo) end
  local width = 40
  local lines = {base ~= 0 and ('%s per layer (bars start at %s)'):format(metric, fmt(base, 4)) or ('%s per layer'):format(metric)}
  local name_width = 0
  for _, v in ipairs(values) do name_width = math.max(name_width, #v[1]) end
  local span = math.max(math.abs(hi - base), math.abs(lo - base))
  for _, v in ipairs(values) do
    local n = v[2] and v[2] == v[2] and span > 0 and math.abs(v[2] - base) / span * width or 0
    local full = math.floor(n)
    local part = math.floor((n - full) * 8 + 0.5)
    local bar = ('█'):rep(full) .. (part > 0 and full < width and bars[part + 1] or '')
    lines[#lines + 1] = ('%s%s  %s %s'):format(v[1], (' '):rep(name_width - #v[1]), bar, fmt(v[2]))
  end
  local out = table.concat(lines, '\n')
  if not quiet then print(out) end
  return out
end

return text
