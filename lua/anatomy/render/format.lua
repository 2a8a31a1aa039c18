-- The autopsy as text: numbers as the tables print them, the per-layer
-- table with its verdict note, the parameter table, and terminal bar charts.
local format = {}

-- format.shape(t) -> a tensor's shape as errors and tables write it ('2x3'; '' for a scalar)
function format.shape(t) return table.concat(t:size(), 'x') end

-- format.count(n) -> the whole number n with thousands separators
-- ('1,611,329', '-12,000')
function format.count(n)
  local s = tostring(math.floor(n))
  repeat
    local k
    s, k = s:gsub('^(-?%d+)(%d%d%d)', '%1,%2')
  until k == 0
  return s
end

-- format.number(v, digits) -> '-' for nil, 'nan', scientific for very large or small values
local function fmt(v, digits)
  if v == nil then return '-' end
  if v ~= v then return 'nan' end
  local a = math.abs(v)
  if a ~= 0 and (a >= 1e5 or a < 1e-3) then return ('%.2e'):format(v) end
  return ('%.' .. (digits or 3) .. 'f'):format(v)
end
format.number = fmt


-- The measures of the per-layer table, each under the one name the
-- terminal, the HTML report, the JSON, the CSV and a:plot use, with what it
-- measures and how the verdict uses it (the legend under both tables).
format.measures = {
  {'grad_norm', 'norm of the loss gradient of the row\'s parameters; its share of the largest row\'s is the verdict\'s gradient share'},
  {'erank', 'effective rank of the row\'s output (exp of the entropy of its singular values), with its share of the width'},
  {'entropy', 'mean entropy of the attention rows, in nats (low: sharp attention)'},
  {'diag', 'mean attention a position pays to itself'},
  {'act_std', 'standard deviation of the row\'s output'},
  {'amplification', 'std of the block\'s output over std of its input; the verdict says exploding above the threshold'},
  {'residual', 'mean |output - input| / |input| per token: the block\'s own contribution beside its input; a passenger below the threshold'},
  {'influence', '1 - the mean cosine between the block\'s input and output, per token (how far it turns the stream); the least influential are the ones removed together'},
  {'lens_loss', 'loss of the readout (logit lens) applied to the row\'s output'},
  -- with a tuned lens (autopsy.run{lens = l}): shown when a row has them, beside lens_loss
  {'lens_kl', 'KL(final || logit lens) in nats: how far the row\'s output read as it is lies from the model\'s prediction', true},
  {'tuned_lens_loss', 'loss of the tuned lens (the row\'s output through its trained affine translator, then the readout)', true},
  {'tuned_kl', 'KL(final || tuned lens) in nats', true},
  {'removal_loss', 'loss of the model with the block removed (its output replaced by its input); a passenger when it adds less than the threshold of the loss'},
  -- a residual wrapper whose skip path is not the identity (nn.Gate, nn.HyperConnections): shown when a row has them
  {'f_residual', 'residual wrapper: mean |f(x)| / |skip(x)| per token, f\'s output beside the wrapper\'s own path (gate(x)); replaces residual in the verdict', true},
  {'f_removal_loss', 'residual wrapper: loss with f zeroed and the wrapper\'s own path kept (gate(x) alone); replaces removal_loss in the verdict', true},
  {'gate_identity_loss', 'nn.Gate: loss with the gate replaced by the identity (x + f(x)), f kept', true},
  {'gate_grad', 'nn.Gate: norm of the gradient of the gate\'s weight', true},
  {'gate_identity', 'nn.Gate: |W - I| / sqrt(d), how far the gate has moved from the identity', true},
  -- with SAEs (autopsy.run{saes = {...}}): shown on the rows of the layers they read
  {'sae_alive', 'SAE in the layer: features that fired on the evaluation tokens (of its d_sae)', true},
  {'sae_l0', 'SAE in the layer: features active per token', true},
  {'sae_ev', 'SAE in the layer: explained variance of its reconstruction, 1 - sum |x - x_hat|^2 / sum |x - mean|^2', true},
  {'sae_ce_recovered', 'SAE in the layer: (loss zero-ablated - loss spliced) / (loss zero-ablated - clean loss), the reconstruction in place of the point', true},
  {'verdict', 'worker, passenger, exploding, or boundary (input/output rows): the rule is under the table'},
}

-- format.columns(a) -> the measures (format.measures entries) a's table
-- shows: every one that is always there, and those of residual wrappers
-- when a row has them. The terminal table, the HTML table and the legend use it.
function format.columns(self)
  local out = {}
  for _, m in ipairs(format.measures) do
    local shown = not m[3]
    for _, r in ipairs(m[3] and self.rows or {}) do shown = shown or r[m[1]] ~= nil end
    if shown then out[#out + 1] = m end
  end
  return out
end

-- format.legend(a) -> lines: what each column measures, then the verdicts' rule.
function format.legend(self)
  local lines = {}
  local columns, width = format.columns(self), 14
  for _, m in ipairs(columns) do width = math.max(width, #m[1] + 2) end
  for _, m in ipairs(columns) do lines[#lines + 1] = ('%-' .. width .. 's%s'):format(m[1], m[2]) end
  local t = self.thresholds
  lines[#lines + 1] = ('verdicts: boundary = an input or output row with >= %g of the largest grad_norm while the median block has < %g; '
    .. 'passenger = residual < %g, grad_norm share < %g, or removal_loss - loss < %g of the loss (for a residual wrapper: '
    .. 'f_residual and f_removal_loss); exploding = amplification > %g in this block and the one before or after it '
    .. '(the stream\'s growth compounding)'):format(
    t.boundary, t.boundary_middle, t.passenger, t.passenger_grad, t.passenger_removal or 0, t.exploding)
  return lines
end

-- The per-layer table.
function format.table(self)
  local cols = {
    {'layer', function(r) return r.name end},
    {'grad_norm', function(r) return fmt(r.grad_norm, 4) end},
    {'erank', function(r) return r.erank and ('%s (%d%%)'):format(fmt(r.erank, 1), math.floor(100 * r.erank_ratio + 0.5)) or '-' end},
    {'entropy', function(r) return fmt(r.entropy) end},
    {'diag', function(r) return fmt(r.diag) end},
    {'act_std', function(r) return fmt(r.act_std) end},
    {'amplification', function(r) return fmt(r.amplification, 2) end},
    {'residual', function(r) return fmt(r.residual) end},
    {'influence', function(r) return fmt(r.influence, 4) end},
    {'lens_loss', function(r) return fmt(r.lens_loss) end},
    {'removal_loss', function(r) return fmt(r.removal_loss) end},
  }
  local after_lens = 11  -- the tuned lens's columns go right after lens_loss
  for _, m in ipairs(format.columns(self)) do  -- a tuned lens's and a residual wrapper's columns, when a row has them
    if m[1] == 'lens_kl' or m[1] == 'tuned_lens_loss' or m[1] == 'tuned_kl' then
      table.insert(cols, after_lens, {m[1], function(r) return fmt(r[m[1]]) end})
      after_lens = after_lens + 1
    elseif m[1] == 'sae_alive' then
      cols[#cols + 1] = {m[1], function(r) return r.sae_alive and ('%d/%d'):format(r.sae_alive, r.sae_d_sae) or '-' end}
    elseif m[3] and m[1] ~= 'gate_grad' and m[1] ~= 'gate_identity' then
      cols[#cols + 1] = {m[1], function(r) return fmt(r[m[1]]) end}
    end
  end
  cols[#cols + 1] = {'verdict', function(r) return r.verdict or '' end}
  local cells, widths = {}, {}
  for c, col in ipairs(cols) do widths[c] = #col[1] end
  for i, r in ipairs(self.rows) do
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
  local out = {('autopsy of %s: loss %s'):format(self.model, fmt(self.loss, 4)), line(header)}
  out[#out + 1] = ('-'):rep(#out[2])
  for i in ipairs(self.rows) do out[#out + 1] = line(cells[i]) end
  local gates = {}
  for _, r in ipairs(self.rows) do
    if r.gate_grad then gates[#gates + 1] = ('%s gate_grad %s, gate_identity (|W - I|/sqrt(d)) %s'):format(r.name, fmt(r.gate_grad, 4), fmt(r.gate_identity)) end
  end
  if #gates > 0 then out[#out + 1] = 'gates: ' .. table.concat(gates, '; ') end
  local shown = {lens_loss = 'lens_loss', entropy = 'entropy and diag', removal_loss = 'removal_loss', sae_ce_recovered = 'sae_ce_recovered'}
  for _, key in ipairs{'entropy', 'lens_loss', 'removal_loss', 'sae_ce_recovered'} do
    if self.missing and self.missing[key] then out[#out + 1] = ('%s: - because %s'):format(shown[key], self.missing[key]) end
  end
  if self.removal then
    out[#out + 1] = ('without the %d least influential blocks (%s): loss %s (full model %s)'):format(
      self.removal.k, table.concat(self.removal.blocks, ', '), fmt(self.removal.loss, 4), fmt(self.removal.full_loss, 4))
  end
  out[#out + 1] = ''
  for _, line in ipairs(format.legend(self)) do out[#out + 1] = line end
  out[#out + 1] = ''
  out[#out + 1] = format.parameter_table(self)
  return table.concat(out, '\n')
end

-- Each parameter's gradient norm and, for matrices, its effective rank.
function format.parameter_table(self)
  local ranks = {}
  for _, w in ipairs(self.weights) do ranks[w.name] = w end
  local width = 9
  for _, p in ipairs(self.params) do width = math.max(width, #p.name) end
  local lines = {('%-' .. width .. 's  %10s  %10s  %s'):format('parameter', 'shape', 'grad_norm', 'erank (of full)')}
  for _, p in ipairs(self.params) do
    local w = ranks[p.name]
    lines[#lines + 1] = ('%-' .. width .. 's  %10s  %10s  %s'):format(p.name, p.shape, fmt(p.grad_norm, 4),
      w and ('%s (%d%%)'):format(fmt(w.erank, 1), math.floor(100 * w.ratio + 0.5)) or '')
  end
  return table.concat(lines, '\n')
end


local bars = {' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'}

-- format.plot(a, metric) (a:plot(metric)): a compact chart of one column per layer, in the terminal
-- ('grad_norm', 'erank', 'entropy', 'diag', 'act_std', 'amplification', 'residual',
-- 'influence', 'lens_loss', 'removal_loss').
function format.plot(self, metric, quiet)
  local columns = {'grad_norm', 'erank', 'entropy', 'diag', 'act_std', 'act_mean', 'act_max', 'act_rms', 'amplification',
    'residual', 'influence', 'lens_loss', 'lens_agree', 'lens_kl', 'tuned_lens_loss', 'tuned_kl', 'removal_loss', 'f_residual', 'f_influence', 'f_removal_loss',
    'gate_identity_loss', 'gate_grad', 'gate_identity'}
  local known = false
  for _, c in ipairs(columns) do known = known or c == (metric or 'grad_norm') end
  if not known then
    error(("bad argument #1 to 'plot' (unknown column '%s'; the columns are %s)"):format(tostring(metric), table.concat(columns, ', ')), 3)
  end
  metric = metric or 'grad_norm'
  local values, lo, hi = {}, math.huge, -math.huge
  for _, r in ipairs(self.rows) do
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
  local text = table.concat(lines, '\n')
  if not quiet then print(text) end
  return text
end

return format
