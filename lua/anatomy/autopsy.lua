-- autopsy: one call that says what each layer of a model is doing: where the
-- gradient goes, how rank collapses, whether attention is sharp or flat,
-- how activations grow, which blocks are passengers, what the logit lens
-- reads at each depth and what removing a layer costs. The result prints as
-- a table, saves as JSON and renders as an HTML report (autopsy/report.lua).
local json = require 'anatomy.json'

local autopsy = {}

-- Verdict thresholds (override with opts.thresholds):
--   exploding  std(output) / std(input) of a block above `exploding`
--   passenger  a block whose f(x) is small beside x (residual ratio below
--              `passenger`) or whose parameters get almost no gradient
--              (below `passenger_grad` of the largest row's): the gradient passes by
--   boundary   an input or output row holding at least `boundary` of the
--              largest gradient while the median block holds under `boundary_middle`
--   worker     a block that is none of these
autopsy.thresholds = {exploding = 2.0, passenger = 0.05, passenger_grad = 0.02, boundary = 0.5, boundary_middle = 0.1}

autopsy.all_metrics = {'grad_norm', 'erank', 'attn_entropy', 'act_std', 'residual', 'influence', 'logit_lens', 'removal', 'weight_erank'}

local Autopsy = {}
Autopsy.__index = Autopsy
autopsy.Autopsy = Autopsy

local function layers_of(model)
  local layers, why = model:layers()
  if not layers then error('autopsy: ' .. why, 3) end
  return layers
end

local function l2(list)
  local s = 0
  for _, v in ipairs(list) do s = s + v * v end
  return math.sqrt(s)
end

local function median(values)
  local v = {}
  for i, x in ipairs(values) do v[i] = x end
  table.sort(v)
  if #v == 0 then return 0 end
  return #v % 2 == 1 and v[(#v + 1) / 2] or (v[#v / 2] + v[#v / 2 + 1]) / 2
end

local function starts_with(s, prefix) return s:sub(1, #prefix) == prefix end

-- One forward and backward with every layer's input and output recorded.
local function dissect_batch(model, layers, x, y)
  local io_ = {}
  local handles = {}
  for i, l in ipairs(layers) do
    handles[#handles + 1] = probe.replace(model, l[1], function(out, _, input)
      io_[i] = {input = torch.is_tensor(input) and input:detach() or nil, output = out:detach()}
    end)
  end
  local patterns, pattern_handle = probe.attach_capture(model, {filter = {'*.pattern'}})
  model:zero_grad()
  local logits = model(x)
  local loss = nn.functional.cross_entropy(logits, y)
  loss:backward()
  for _, h in ipairs(handles) do h:remove() end
  pattern_handle:remove()
  return {loss = loss:item(), logits = logits:detach(), io = io_, patterns = patterns}
end

-- autopsy.step(model, fn) -> snapshot, fn's result: the autopsy's per-step
-- measurements from the forward and backward that fn() runs (a training
-- step's own: no extra pass). fn must run the model and call backward.
-- snapshot = {grad_norm = {param = ‖grad‖}, weight_erank = {param = erank of
-- every 2-D weight}, layers = {{name, act_mean, act_std, act_max, act_rms,
-- entropy, diag}, ...}}. Weight ranks come from one batched Gram-matrix
-- eigendecomposition per weight shape; gradient norms from one fused pass.
function autopsy.step(model, fn)
  local layers = layers_of(model)
  local filter = {'*.pattern'}
  for _, l in ipairs(layers) do filter[#filter + 1] = l[1] end
  local capture, handle = probe.attach_capture(model, {filter = filter})
  local ok, result = pcall(fn)
  handle:remove()
  if not ok then error(result, 0) end
  local names, grads, weights, weight_names = {}, {}, {}, {}
  for name, p in model:named_parameters() do
    names[#names + 1] = name
    grads[#names] = p.grad or false
    if p:dim() == 2 then
      weights[#weights + 1] = p
      weight_names[#weights] = name
    end
  end
  local snap = {grad_norm = {}, weight_erank = {}, layers = {}}
  for i, n in ipairs(torch.metrics.norms(grads)) do
    if n == n then snap.grad_norm[names[i]] = n end
  end
  for i, r in ipairs(torch.metrics.eranks(weights)) do snap.weight_erank[weight_names[i]] = r end
  for i, l in ipairs(layers) do
    local row = {name = l[1]}
    local out = capture[l[1]]
    if out then
      local st = torch.metrics.activation_stats(out)
      row.act_mean, row.act_std, row.act_max, row.act_rms = st.mean, st.std, st.max_abs, st.rms
    end
    for name, pattern in pairs(capture) do
      if name ~= 'grads' and name:find('%.pattern$') and starts_with(name, l[1] .. '.') then
        row.entropy = torch.metrics.attention_entropy(pattern)
        row.diag = torch.metrics.diagonal_mass(pattern)
        break
      end
    end
    snap.layers[i] = row
  end
  return snap, result
end

-- autopsy.run(model, batch_or_corpus, {metrics = {...}, steps = 1, batch = 8, seq, thresholds, k, history, probe_text})
-- batch_or_corpus: a corpus (batches from its val split) or {inputs, targets}.
-- steps: batches to average over. k: how many lowest-influence blocks the
-- removal sweep drops together (default: half). history: a train.fit run
-- whose losses and probe history go into the report. probe_text: a sentence
-- whose attention maps the report shows (with a corpus to encode it).
-- config: the calling script's settings, kept in the provenance record
-- (a.provenance: data, model, training, software, machine; see provenance.lua).
function autopsy.run(model, source, opts)
  opts = opts or {}
  local want = {}
  for _, m in ipairs(opts.metrics or autopsy.all_metrics) do want[m] = true end
  local thresholds = {}
  for k, v in pairs(autopsy.thresholds) do thresholds[k] = (opts.thresholds or {})[k] or v end
  local layers = layers_of(model)
  local seq = opts.seq or (rawget(model, 'config') and model.config.seq) or 64
  local function batch()
    if type(source) == 'table' and torch.is_tensor(source[1]) then return source[1], source[2] end
    return source:batch(opts.batch or 8, seq, {split = 'val'})
  end

  local was_training = model.training
  model:eval()
  local steps = opts.steps or 1
  local acc = {}            -- name -> sum over batches
  local function add(key, v) if v ~= nil and v == v then acc[key] = (acc[key] or 0) + v end end
  local last
  local entropy_heads, patterns = {}, {}   -- of the last batch: per head, and (T, T) maps of the first sequence
  local seen_batches = {}
  local patterns_text
  for _ = 1, steps do
    local x, y = batch()
    local d = dissect_batch(model, layers, x, y)
    last = {x = x, y = y, d = d}
    seen_batches[#seen_batches + 1] = {x, y}
    add('loss', d.loss)
    for name, p in model:named_parameters() do
      if p.grad ~= nil then add('grad:' .. name, p.grad:norm():item()) end
    end
    local final_top = d.logits:argmax(-1)
    for i, l in ipairs(layers) do
      local rec = d.io[i]
      if rec then
        local inp, out = rec.input, rec.output
        local stats = torch.metrics.activation_stats(out)
        add(i .. ':act_mean', stats.mean)
        add(i .. ':act_std', stats.std)
        add(i .. ':act_max', stats.max_abs)
        add(i .. ':act_rms', stats.rms)
        if want.erank then add(i .. ':erank', torch.metrics.erank(out)) end
        if inp and table.concat(inp:size(), 'x') == table.concat(out:size(), 'x') then
          local in_std = torch.metrics.activation_stats(inp).std
          add(i .. ':amplification', stats.std / math.max(in_std, 1e-30))
          if want.residual then add(i .. ':residual', torch.metrics.residual_ratio(inp, out)) end
          if want.influence then add(i .. ':influence', torch.metrics.block_influence(inp, out)) end
        end
        if want.logit_lens and model.readout then
          local ok, lens = pcall(function() return torch.no_grad(function() return model:readout(out) end) end)
          if ok and lens:size(-1) == d.logits:size(-1) then
            add(i .. ':lens_loss', nn.functional.cross_entropy(lens, y):item())
            add(i .. ':lens_agree', lens:argmax(-1):eq(final_top):double():mean():item())
          end
        end
      end
      if want.attn_entropy then
        for name, pattern in pairs(d.patterns) do
          if name ~= 'grads' and starts_with(name, l[1] .. '.') then
            local mean, heads = torch.metrics.attention_entropy(pattern)
            add(i .. ':entropy', mean)
            entropy_heads[l[1]] = heads:tolist()
            local T = math.min(pattern:size(3), 24)
            patterns[l[1]] = pattern[1][1]:narrow(1, 1, T):narrow(2, 1, T):tolist()
            add(i .. ':diag', torch.metrics.diagonal_mass(pattern))
            break
          end
        end
      end
    end
  end
  local function avg(key) return acc[key] and acc[key] / steps end

  -- attention maps for a probe sentence, when one is given (else the first validation window)
  if opts.probe_text and type(source) == 'table' and source.encode then
    local ok, ids = pcall(source.encode, source, opts.probe_text)
    if ok and ids:numel() > 1 then
      ids = ids:narrow(1, 1, math.min(ids:numel(), seq)):unsqueeze(1)
      local cap = probe.capture(model, {filter = '*.pattern'}, function() torch.no_grad(function() model(ids) end) end)
      for _, l in ipairs(layers) do
        for name, pattern in pairs(cap) do
          if name ~= 'grads' and starts_with(name, l[1] .. '.') then
            local T = math.min(pattern:size(3), 24)
            patterns[l[1]] = pattern[1][1]:narrow(1, 1, T):narrow(2, 1, T):tolist()
          end
        end
      end
      patterns_text = opts.probe_text
    end
  end

  -- rows: the input (embedding), each layer, the output (everything after the stack)
  local a = setmetatable({model = nn.typename(model), loss = avg('loss'), rows = {}, params = {}, weights = {},
    thresholds = thresholds, metrics = opts.metrics or autopsy.all_metrics, history = opts.history,
    entropy_heads = entropy_heads, patterns = patterns, patterns_text = patterns_text}, Autopsy)
  local first_child
  for name in model:named_children() do first_child = first_child or name end
  local input_row = {name = first_child or 'input', kind = 'input', grads = {}}
  local output_row = {name = 'output', kind = 'output', grads = {}}
  local block_rows = {}
  for i, l in ipairs(layers) do
    block_rows[i] = {name = l[1], kind = 'block', class = nn.typename(l[2]), grads = {},
      act_mean = avg(i .. ':act_mean'), act_std = avg(i .. ':act_std'), act_max = avg(i .. ':act_max'),
      act_rms = avg(i .. ':act_rms'), erank = avg(i .. ':erank'),
      amplification = avg(i .. ':amplification'), residual = avg(i .. ':residual'), influence = avg(i .. ':influence'),
      entropy = avg(i .. ':entropy'), diag = avg(i .. ':diag'), lens_loss = avg(i .. ':lens_loss'), lens_agree = avg(i .. ':lens_agree')}
    -- a gated residual: the gate's gradient, and how far the gate is from the identity it replaced
    if nn.is_instance(l[2], nn.Gate) then
      local W = l[2].gate.weight
      block_rows[i].gate_grad = avg('grad:' .. l[1] .. '.gate.weight')
      block_rows[i].gate_identity = (W:detach():double() - torch.eye(W:size(1), {dtype = 'float64'})):norm():item() / math.sqrt(W:size(1))
    end
    local dim = last.d.io[i] and last.d.io[i].output:size(-1)
    if block_rows[i].erank and dim then block_rows[i].erank_ratio = block_rows[i].erank / dim end
  end
  for name, p in model:named_parameters() do
    local g = avg('grad:' .. name)
    a.params[#a.params + 1] = {name = name, grad_norm = g, shape = table.concat(p:size(), 'x')}
    if want.weight_erank and p:dim() == 2 then
      local r = torch.metrics.erank(p)
      a.weights[#a.weights + 1] = {name = name, erank = r, ratio = r / math.min(p:size(1), p:size(2)), shape = table.concat(p:size(), 'x')}
    end
    local row = output_row
    for i, l in ipairs(layers) do if starts_with(name, l[1] .. '.') then row = block_rows[i] end end
    if row == output_row and first_child and starts_with(name, first_child .. '.') then row = input_row end
    if g then row.grads[#row.grads + 1] = g end
  end
  a.rows[1] = input_row
  for _, r in ipairs(block_rows) do a.rows[#a.rows + 1] = r end
  a.rows[#a.rows + 1] = output_row
  for _, r in ipairs(a.rows) do r.grad_norm = #r.grads > 0 and l2(r.grads) or nil end

  -- removal sweep: each block skipped in turn, then the k least influential
  -- together; the loss is averaged over the same batches as the full model's
  if want.removal then
    local function loss_without(names)
      local hs = {}
      for _, n in ipairs(names) do hs[#hs + 1] = probe.skip(model, n) end
      local ok, total = pcall(function()
        return torch.no_grad(function()
          local sum = 0
          for _, b in ipairs(seen_batches) do sum = sum + nn.functional.cross_entropy(model(b[1]), b[2]):item() end
          return sum / #seen_batches
        end)
      end)
      for _, h in ipairs(hs) do h:remove() end
      return ok and total or nil
    end
    for _, r in ipairs(block_rows) do r.removal_loss = loss_without({r.name}) end
    local ranked = {}
    for _, r in ipairs(block_rows) do if r.influence then ranked[#ranked + 1] = r end end
    table.sort(ranked, function(p, q) return p.influence < q.influence end)
    local k = math.min(opts.k or math.floor(#block_rows / 2), #ranked)
    if k > 0 then
      local names = {}
      for i = 1, k do names[i] = ranked[i].name end
      a.removal = {k = k, blocks = names, loss = loss_without(names), full_loss = a.loss}
    end
  end

  -- verdicts
  local largest = 0
  for _, r in ipairs(a.rows) do largest = math.max(largest, r.grad_norm or 0) end
  local shares = {}
  for _, r in ipairs(a.rows) do
    r.grad_share = largest > 0 and r.grad_norm and r.grad_norm / largest or nil
    if r.kind == 'block' then shares[#shares + 1] = r.grad_share or 0 end
  end
  local middle = median(shares)
  for _, r in ipairs(a.rows) do
    if r.kind == 'block' then
      if r.amplification and r.amplification > thresholds.exploding then r.verdict = 'exploding'
      elseif (r.residual and r.residual < thresholds.passenger) or (r.grad_share and r.grad_share < thresholds.passenger_grad) then
        r.verdict = 'passenger'
      else r.verdict = 'worker' end
    elseif r.grad_share and r.grad_share >= thresholds.boundary and middle < thresholds.boundary_middle then
      r.verdict = 'boundary'
    end
  end
  model:train(was_training)
  local corpus = getmetatable(source) == data.Corpus and source or nil
  a.provenance = require('anatomy.provenance').record{corpus = corpus, model = model, run = opts.history, config = opts.config}
  return a
end

local function fmt(v, digits)
  if v == nil then return '-' end
  if v ~= v then return 'nan' end
  local a = math.abs(v)
  if a ~= 0 and (a >= 1e5 or a < 1e-3) then return ('%.2e'):format(v) end
  return ('%.' .. (digits or 3) .. 'f'):format(v)
end
autopsy.format = fmt

-- The per-layer table.
function Autopsy:__tostring()
  local cols = {
    {'layer', function(r) return r.name end},
    {'|grad|', function(r) return fmt(r.grad_norm, 4) end},
    {'erank', function(r) return r.erank and ('%s (%d%%)'):format(fmt(r.erank, 1), math.floor(100 * r.erank_ratio + 0.5)) or '-' end},
    {'entropy', function(r) return fmt(r.entropy) end},
    {'diag', function(r) return fmt(r.diag) end},
    {'act std', function(r) return fmt(r.act_std) end},
    {'gain', function(r) return fmt(r.amplification, 2) end},
    {'f(x)/x', function(r) return fmt(r.residual) end},
    {'influence', function(r) return fmt(r.influence, 4) end},
    {'lens loss', function(r) return fmt(r.lens_loss) end},
    {'w/o loss', function(r) return fmt(r.removal_loss) end},
    {'verdict', function(r) return r.verdict or '' end},
  }
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
    if r.gate_grad then gates[#gates + 1] = ('%s |grad| %s, |W - I|/sqrt(d) %s'):format(r.name, fmt(r.gate_grad, 4), fmt(r.gate_identity)) end
  end
  if #gates > 0 then out[#out + 1] = 'gates: ' .. table.concat(gates, '; ') end
  if self.removal then
    out[#out + 1] = ('without the %d least influential blocks (%s): loss %s (full model %s)'):format(
      self.removal.k, table.concat(self.removal.blocks, ', '), fmt(self.removal.loss, 4), fmt(self.removal.full_loss, 4))
  end
  local t = self.thresholds
  out[#out + 1] = ('verdicts: boundary = input/output row with >= %g of the largest |grad| while the median block has < %g; '
    .. 'passenger = f(x)/x < %g or |grad| share < %g; exploding = gain > %g'):format(
    t.boundary, t.boundary_middle, t.passenger, t.passenger_grad, t.exploding)
  out[#out + 1] = ''
  out[#out + 1] = self:parameter_table()
  return table.concat(out, '\n')
end

-- Each parameter's gradient norm and, for matrices, its effective rank.
function Autopsy:parameter_table()
  local ranks = {}
  for _, w in ipairs(self.weights) do ranks[w.name] = w end
  local width = 9
  for _, p in ipairs(self.params) do width = math.max(width, #p.name) end
  local lines = {('%-' .. width .. 's  %10s  %10s  %s'):format('parameter', 'shape', '|grad|', 'erank (of full)')}
  for _, p in ipairs(self.params) do
    local w = ranks[p.name]
    lines[#lines + 1] = ('%-' .. width .. 's  %10s  %10s  %s'):format(p.name, p.shape, fmt(p.grad_norm, 4),
      w and ('%s (%d%%)'):format(fmt(w.erank, 1), math.floor(100 * w.ratio + 0.5)) or '')
  end
  return table.concat(lines, '\n')
end

-- The autopsy as plain data (what json() writes).
function Autopsy:data()
  local rows = {}
  for i, r in ipairs(self.rows) do
    local copy = {}
    for k, v in pairs(r) do if k ~= 'grads' then copy[k] = v end end
    rows[i] = copy
  end
  return {provenance = self.provenance, model = self.model, loss = self.loss, rows = rows, params = self.params, weights = self.weights,
    removal = self.removal, thresholds = self.thresholds,
    entropy_heads = self.entropy_heads, patterns = self.patterns,
    history = self.history and {train = self.history.train, val = self.history.val, probes = self.history.probes,
      first_step = self.history.first_step} or nil}
end

-- a:json(path): writes the autopsy as JSON; returns path
function Autopsy:json(path)
  return require('anatomy.fs').write_atomic(path, json.encode(self:data()) .. '\n')
end

local bars = {' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'}

-- a:plot(metric): a compact chart of one column per layer, in the terminal
-- ('grad_norm', 'erank', 'entropy', 'diag', 'act_std', 'amplification', 'residual',
-- 'influence', 'lens_loss', 'removal_loss').
function Autopsy:plot(metric)
  metric = metric or 'grad_norm'
  local values, hi = {}, 0
  for _, r in ipairs(self.rows) do
    local v = r[metric]
    values[#values + 1] = {r.name, v}
    if v and v == v then hi = math.max(hi, math.abs(v)) end
  end
  local width = 40
  local lines = {('%s per layer'):format(metric)}
  local name_width = 0
  for _, v in ipairs(values) do name_width = math.max(name_width, #v[1]) end
  for _, v in ipairs(values) do
    local n = v[2] and hi > 0 and math.abs(v[2]) / hi * width or 0
    local full = math.floor(n)
    local part = math.floor((n - full) * 8 + 0.5)
    local bar = ('█'):rep(full) .. (part > 0 and full < width and bars[part + 1] or '')
    lines[#lines + 1] = ('%s%s  %s %s'):format(v[1], (' '):rep(name_width - #v[1]), bar, fmt(v[2]))
  end
  local text = table.concat(lines, '\n')
  print(text)
  return text
end

return autopsy
