-- autopsy.run: measures a model on a few batches (one forward and backward
-- each, every layer's input and output recorded), reads the logit lens,
-- removes blocks one at a time, and returns an Autopsy with a row per layer.
-- Its phases, each a function below over one state table `s`: measure (each
-- batch's forward and backward, every layer's numbers), maps (the attention
-- maps of a probe text), rows (the Autopsy's rows from the averages) and
-- removal (blocks skipped, alone and together). Which measure each phase
-- computes, and so what a row holds, is the registry's (measures.lua).
local torch = require('anatomy.torch')
local native = require('anatomy.torch.native')
local probe = require('anatomy.probe')
local nn = require('anatomy.nn')
local measure = require('anatomy.autopsy.measure')
local measures = require('anatomy.autopsy.measures')
local verdicts = require('anatomy.autopsy.verdicts')
local Autopsy = require('anatomy.autopsy.Autopsy')
local provenance = require('anatomy.io.provenance')
local data = require('anatomy.data')
local inputs = require('anatomy.probe.inputs')
local format = require('anatomy.render.format')
local options = require('anatomy.torch.options')
local lens_module = require('anatomy.probe.lens')
local args = require('anatomy.autopsy.arguments')
local moe = require('anatomy.autopsy.moe')

local function same_shape(a, b) return format.shape(a) == format.shape(b) end
local hidden_from

-- The state of one autopsy: its settings, the sums over batches and what the
-- last batch showed. The sums: sums.loss, sums.grads[parameter name] (its
-- gradient norm) and sums.layers[i][measure] (layer i's, under the
-- registry's name of a measure of the batches phase), each divided by the
-- batches at the end (avg).
local function start(model, source, opts)
  local s = {model = model, source = source, opts = opts, want = {}, thresholds = {}, missing = {},
    sums = {grads = {}, layers = {}}, entropy_heads = {}, patterns = {}, maps = {}, seen_batches = {}, steps = opts.steps or 1}
  for _, m in ipairs(opts.metrics or measure.all_metrics) do s.want[m] = true end
  for k, v in pairs(verdicts.thresholds) do s.thresholds[k] = (opts.thresholds or {})[k] or v end
  s.layers = measure.layers(model)
  for i in ipairs(s.layers) do s.sums.layers[i] = {} end
  s.seq = opts.seq or model:context() or 64
  -- a model with hidden_from(i, h) (the model protocol): its last layer's
  -- lens is the forward's own logits, and removing layer j reruns only
  -- layers j+1..N from the input j read (removing the last is the lens of
  -- the one before it)
  s.stepwise = type(model.hidden_from) == 'function' and type(model.readout) == 'function'
  return s
end

-- add(s, i, name, v): v (nil or nan: nothing) added to layer i's sum of a
-- measure the batches phase computes; add_to(s.sums.grads, name, v) and
-- add_to(s.sums, 'loss', v) the same for the other sums
local function add_to(sums, key, v) if v ~= nil and v == v then sums[key] = (sums[key] or 0) + v end end
local function add(s, i, name, v)
  local m = measures.by_name[name]
  if not (m and m.phase == 'batches') then error(("autopsy.run: '%s' is no measure of the batches phase (measures.lua)"):format(name)) end
  add_to(s.sums.layers[i], name, v)
end
-- the average over the batches of a sum (sums: s.sums, s.sums.grads or s.sums.layers[i]), or nil
local function avg(s, sums, key) return sums[key] and sums[key] / s.steps end

-- head_loss(model, h (B, T, C), y, top) -> the mean cross-entropy of
-- readout(h) against y, and (with top) the share of positions whose top
-- token is top's
local function head_loss(model, h, y, top)
  return torch.no_grad(function()
    local logits = model:readout(h)
    local ce = nn.functional.cross_entropy(logits, y):item()
    return ce, top and logits:argmax(-1):eq(top):double():mean():item() or nil, logits
  end)
end

-- With a tuned lens ({lens = l}): layer i's output read through the logit
-- lens (its KL to the final distribution, lens_kl) and through the tuned
-- lens (tuned_lens_loss, tuned_kl). read: the logit lens's logits.
local function tuned(s, d, i, out, y, read)
  torch.no_grad(function()
    d.final_logp = d.final_logp or d.logits:log_softmax(-1)  -- once per batch, for every layer
    local final_logp = d.final_logp
    add(s, i, 'lens_kl', lens_module._kl(final_logp, read):mean():item())
    local t = s.opts.lens:readout(i, out)
    add(s, i, 'tuned_lens_loss', nn.functional.cross_entropy(t, y):item())
    add(s, i, 'tuned_kl', lens_module._kl(final_logp, t):mean():item())
  end)
end

-- every head's map (H, T', T') of the first sequence, T' <= 32, and its tokens
local function keep_maps(s, name, pattern, ids, real)
  local T = math.min(real or pattern:size(3), 32)  -- padded: the first example's real tokens (on the left)
  s.maps[name] = pattern[1]:narrow(2, 1, T):narrow(3, 1, T):float():clone()
  s.map_tokens = inputs.token_texts(ids:narrow(1, 1, T):unsqueeze(1), s.source)[1]
end

-- The logit lens of layer i (output `out`), added to the sums, or why not.
local function lens(s, d, i, out, y, final_top)
  local model, layers = s.model, s.layers
  if not model.readout then
    s.missing.lens_loss = ('%s has no readout(h) (the head applied to a hidden state)'):format(nn.typename(model))
    return
  end
  local ok, read, agree, logits = true, d.logits, nil, nil
  if s.stepwise and i < #layers then
    ok, read, agree, logits = pcall(head_loss, model, out, y, final_top)
    if ok then s.lens_ce[i] = read end
  elseif not s.stepwise or i ~= #layers then
    ok, read = pcall(function() return torch.no_grad(function() return model:readout(out) end) end)
  end
  if ok and s.lens_ce[i] then
    add(s, i, 'lens_loss', s.lens_ce[i])
    add(s, i, 'lens_agree', agree)
    if s.opts.lens then tuned(s, d, i, out, y, logits) end
  elseif ok and torch.is_tensor(read) and read:size(-1) == d.logits:size(-1) then
    s.lens_ce[i] = nn.functional.cross_entropy(read, y):item()
    add(s, i, 'lens_loss', s.lens_ce[i])
    add(s, i, 'lens_agree', read:argmax(-1):eq(final_top):double():mean():item())
    if s.opts.lens then tuned(s, d, i, out, y, read) end
  elseif not ok then
    s.missing.lens_loss = s.missing.lens_loss or ('readout(h) failed: ' .. tostring(read):gsub('^[^\n]-:%d+: ', ''):match('[^\n]*'))
  else
    s.missing.lens_loss = s.missing.lens_loss or ('readout(h) gave %s, not logits over %d tokens'):format(
      torch.is_tensor(read) and format.shape(read) or type(read), d.logits:size(-1))
  end
end

-- Layer i's numbers from one batch's record: activation statistics, what
-- the block adds to its input, its wrapper's branch, the lens, attention.
local function measure_layer(s, d, i, x, y, final_top, eranks_of)
  local want, l, rec = s.want, s.layers[i], d.io[i]
  if rec then
    local inp, out = rec.input, rec.output
    if s.idx then  -- padded: the real positions only
      out = measure.real_rows(out, s.idx)
      if torch.is_tensor(inp) and inp:dim() >= 2 and same_shape(inp, rec.output) then inp = measure.real_rows(inp, s.idx) end
    end
    local stats = torch.metrics.activation_stats(out)
    add(s, i, 'act_mean', stats.mean)
    add(s, i, 'act_std', stats.std)
    add(s, i, 'act_max', stats.max_abs)
    add(s, i, 'act_rms', stats.rms)
    if want.erank then eranks_of[#eranks_of + 1] = {i, out:reshape(-1, out:size(-1))} end
    if inp and same_shape(inp, out) then
      local in_std = torch.metrics.activation_stats(inp).std
      add(s, i, 'amplification', stats.std / math.max(in_std, 1e-30))
      if want.residual then add(s, i, 'residual', torch.metrics.residual_ratio(inp, out)) end
      if want.influence then add(s, i, 'influence', torch.metrics.block_influence(inp, out)) end
    end
    local branch = rec.branch and s.idx and same_shape(rec.branch, rec.output) and measure.real_rows(rec.branch, s.idx) or rec.branch
    if branch and same_shape(branch, out) then
      -- a wrapper's own path (gate(x)) is out - f(x): f's share is measured beside it, not beside x
      local skip = out - branch
      add(s, i, 'f_residual', torch.metrics.residual_ratio(skip, out))
      add(s, i, 'f_influence', torch.metrics.block_influence(skip, out))
    end
    if want.logit_lens then lens(s, d, i, out, y, final_top) end
  end
  if want.attn_entropy then
    for name, pattern in pairs(d.patterns) do
      if name ~= 'grads' and measure.starts_with(name, l[1] .. '.') then
        local mean, heads, diag
        if s.mask then mean, heads, diag = measure.padded_attention(pattern, s.mask)
        else mean, heads = torch.metrics.attention_entropy(pattern) end
        add(s, i, 'entropy', mean)
        -- per head, summed over the batches like the table's column (divided below): one set of batches for both
        local sum = s.entropy_heads[l[1]]
        s.entropy_heads[l[1]] = sum and (sum + heads:double()) or heads:double()
        local T = math.min(s.mask and s.mask[1]:sum():item() or pattern:size(3), 24)
        s.patterns[l[1]] = pattern[1][1]:narrow(1, 1, T):narrow(2, 1, T):tolist()
        keep_maps(s, l[1], pattern, x[1], s.mask and s.mask[1]:sum():item())
        add(s, i, 'diag', diag or torch.metrics.diagonal_mass(pattern))
        break
      end
    end
  end
end

-- model:hidden_from(i, h) without gradients, under the padding mask when
-- the batch is padded.
hidden_from = function(s, i, h)
  if s.mask then s.model:set_padding(s.mask) end
  local ok, out = pcall(torch.no_grad, function() return s.model:hidden_from(i, h) end)
  if s.mask then s.model:set_padding(nil) end
  if not ok then error(out, 0) end
  return out
end

-- Stepwise removal: block j skipped by running the layers after it from
-- the input it read (the last block's removal is the lens before it).
local function removal_stepwise(s, d, y)
  local layers = s.layers
  for j = 1, #layers do
    local ce = j == #layers and j > 1 and s.lens_ce[j - 1]
    if not ce and d.io[j] and torch.is_tensor(d.io[j].input) then
      local ok, loss = pcall(function()
        return head_loss(s.model, measure.real_rows(hidden_from(s, j + 1, d.io[j].input), s.idx), y)
      end)
      if ok then
        ce = loss
      else
        s.missing.removal_loss = s.missing.removal_loss or ('removing a block failed: ' .. tostring(loss):match('[^\n]*'))
      end
    end
    if ce then add_to(s.sums.layers[j], 'removal_loss', ce) end  -- the removal phase's, measured here
  end
end

-- Phase 1: each batch's forward and backward, every layer measured.
local function measure_batches(s)
  local model, source, layers = s.model, s.source, s.layers
  for _ = 1, s.steps do
    local x, y
    if type(source) == 'table' and torch.is_tensor(source[1]) then x, y = source[1], source[2]
    else x, y = source:batch(s.opts.batch or 8, s.seq, {split = 'val', device = model:device()}) end
    local d = measure.dissect(model, layers, x, y, s.mask, s.idx)
    s.last = {x = x, y = y, d = d}
    if not s.loss_on then  -- which tokens `loss` is the mean over, for the report's header
      local given = type(source) == 'table' and torch.is_tensor(source[1])
      s.loss_on = given and ('the batch given (%d x %d tokens%s)'):format(x:size(1), x:size(2), s.mask and ', padded' or '')
        or ('%d random batch%s of %d x %d tokens from the validation split'):format(s.steps, s.steps == 1 and '' or 'es',
          x:size(1), x:size(2))
    end
    -- with the stepwise shortcut, each block's input too: the removal
    -- phase runs from the first block it removes
    local block_inputs = {}
    if s.stepwise and s.want.removal then
      for j = 1, #layers do block_inputs[j] = d.io[j] and d.io[j].input end
    end
    s.seen_batches[#s.seen_batches + 1] = {x, y, inputs = block_inputs}
    y = measure.real_rows(y, s.idx)  -- padded: the real positions' targets, as d.logits holds their predictions
    add_to(s.sums, 'loss', d.loss)
    for name, n in pairs(measure.grad_norms(model)) do add_to(s.sums.grads, name, n) end
    local final_top = d.logits:argmax(-1)
    local eranks_of = {}   -- {layer, (tokens, C)}: one batched call below
    s.lens_ce = {}
    for i = 1, #layers do measure_layer(s, d, i, x, y, final_top, eranks_of) end
    if #eranks_of > 0 then
      local list = {}
      for k, e in ipairs(eranks_of) do list[k] = e[2] end
      for k, r in ipairs(torch.metrics.eranks(list)) do add(s, eranks_of[k][1], 'erank', r) end
    end
    if s.want.removal and s.stepwise then removal_stepwise(s, d, y) end
  end
  for name, sum in pairs(s.entropy_heads) do s.entropy_heads[name] = (sum / s.steps):tolist() end
end

-- Phase 2: attention maps for a probe sentence, when one is given (else
-- the first validation window's stay).
local function probe_maps(s)
  local model, source, text = s.model, s.source, s.opts.probe_text
  if not (text and type(source) == 'table' and source.encode) then return end
  local ok, ids = pcall(source.encode, source, text)
  if not (ok and ids:numel() > 1) then return end
  ids = ids:narrow(1, 1, math.min(ids:numel(), s.seq)):unsqueeze(1):to(model:device())  -- encoded on the CPU
  local cap = probe.capture(model, {filter = '*.pattern'}, function() torch.no_grad(function() model(ids) end) end)
  for _, l in ipairs(s.layers) do
    for name, pattern in pairs(cap) do
      if name ~= 'grads' and measure.starts_with(name, l[1] .. '.') then
        local T = math.min(pattern:size(3), 24)
        s.patterns[l[1]] = pattern[1][1]:narrow(1, 1, T):narrow(2, 1, T):tolist()
        keep_maps(s, l[1], pattern, ids[1])
      end
    end
  end
  s.patterns_text = text
end

-- A block's row: the averages of its numbers (every measure of the batches
-- phase), a gate's own, its checkpoint name.
local function block_row(s, i, l)
  local model = s.model
  local row = {name = l[1], kind = 'block', class = nn.typename(l[2]), grads = {}}
  for _, m in ipairs(measures.rows) do
    if m.phase == 'batches' then row[m.name] = avg(s, s.sums.layers[i], m.name) end
  end
  -- a gated residual: the gate's gradient, and how far the gate is from the identity it replaced
  if nn.is_instance(l[2], nn.Gate) then
    local W = l[2].gate.weight
    row.gate_grad = avg(s, s.sums.grads, l[1] .. '.gate.weight')
    row.gate_identity = (W:detach():double() - torch.eye(W:size(1), {dtype = 'float64', device = W.device})):norm():item() / math.sqrt(W:size(1))
  end
  if rawget(model, 'hf_config') then  -- the checkpoint's spelling of the row (a:attention takes either)
    local hf = probe.checkpoint_spelling(model, l[1])
    if hf ~= l[1] then row.hf_name = hf end
  end
  local dim = s.last.d.io[i] and s.last.d.io[i].output:size(-1)
  if row.erank and dim then row.erank_ratio = row.erank / dim end
  return row
end

-- Phase 3: the rows: the input (embedding), each layer, the output
-- (everything after the stack); each parameter's gradient norm and each
-- 2-D weight's effective rank, and the rows' gradient norms from them.
local function rows(s)
  local model, layers = s.model, s.layers
  local a = setmetatable({model = nn.typename(model), loss = avg(s, s.sums, 'loss'), loss_on = s.loss_on, rows = {}, params = {}, weights = {},
    thresholds = s.thresholds, metrics = s.opts.metrics or measure.all_metrics, history = s.opts.history,
    entropy_heads = s.entropy_heads, patterns = s.patterns, patterns_text = s.patterns_text, attention_maps = s.maps,
    attention_tokens = s.map_tokens}, Autopsy)
  local first_child
  for name in model:named_children() do first_child = first_child or name end
  local input_row = {name = first_child or 'input', kind = 'input', grads = {}}
  local output_row = {name = 'output', kind = 'output', grads = {}}
  s.block_rows = {}
  for i, l in ipairs(layers) do s.block_rows[i] = block_row(s, i, l) end
  local weight_eranks = {}  -- every 2-D weight's, in one batched call
  if s.want.weight_erank then
    local list, names = {}, {}
    for name, p in model:named_parameters() do
      if p:dim() == 2 then list[#list + 1] = p; names[#list] = name end
    end
    for k, r in ipairs(#list > 0 and torch.metrics.eranks(list) or {}) do weight_eranks[names[k]] = r end
  end
  for name, p in model:named_parameters() do
    local g = avg(s, s.sums.grads, name)
    a.params[#a.params + 1] = {name = name, grad_norm = g, shape = format.shape(p)}
    local r = weight_eranks[name]
    if r then
      a.weights[#a.weights + 1] = {name = name, erank = r, ratio = r / math.min(p:size(1), p:size(2)), shape = format.shape(p)}
    end
    local row = output_row
    for i, l in ipairs(layers) do if measure.starts_with(name, l[1] .. '.') then row = s.block_rows[i] end end
    if row == output_row and first_child and measure.starts_with(name, first_child .. '.') then row = input_row end
    if g then row.grads[#row.grads + 1] = g end
  end
  a.rows[1] = input_row
  for _, r in ipairs(s.block_rows) do a.rows[#a.rows + 1] = r end
  a.rows[#a.rows + 1] = output_row
  for _, r in ipairs(a.rows) do r.grad_norm = #r.grads > 0 and measure.l2(r.grads) or nil end
  return a
end

-- The loss over the measured batches with the interventions attach()
-- makes; batch_loss(b): one batch's (default: the whole forward's).
local function loss_with(s, attach, batch_loss)
  local model = s.model
  batch_loss = batch_loss or function(b)
    local out = inputs.forward(model, b[1], s.mask, 'autopsy.run')
    return nn.functional.cross_entropy(measure.real_rows(out, s.idx), measure.real_rows(b[2], s.idx)):item()
  end
  local hs = attach()
  local ok, total = pcall(function()
    return torch.no_grad(function()
      local sum = 0
      for _, b in ipairs(s.seen_batches) do sum = sum + batch_loss(b) end
      return sum / #s.seen_batches
    end)
  end)
  for _, h in ipairs(hs) do h:remove() end
  if not ok then s.missing.removal_loss = s.missing.removal_loss or ('removing a block failed: ' .. tostring(total):match('[^\n]*')) end
  return ok and total or nil
end

-- Stepwise: the loss of a measured batch b run from block `first`'s input (else nil).
local function from_block(s, first)
  local from_stream = s.stepwise and first >= 1 and first < math.huge
  for _, b in ipairs(s.seen_batches) do from_stream = from_stream and torch.is_tensor(b.inputs[first]) end
  return from_stream and function(b)
    return head_loss(s.model, measure.real_rows(hidden_from(s, first, b.inputs[first]), s.idx), measure.real_rows(b[2], s.idx))
  end or nil
end

-- The loss with the blocks `names` skipped. Stepwise: from the input of the
-- first block removed (the layers before it run as in the measured
-- forward), every batch's kept.
local function loss_without(s, names)
  local index = {}
  for i, l in ipairs(s.layers) do index[l[1]] = i end
  local function skips()
    local hs = {}
    for _, n in ipairs(names) do hs[#hs + 1] = probe.skip(s.model, n) end
    return hs
  end
  local first = math.huge
  for _, n in ipairs(names) do first = math.min(first, index[n] or -math.huge) end
  return loss_with(s, skips, from_block(s, first))
end

-- Phase 4: each block skipped in turn (a wrapper's f zeroed, its learned
-- path made the identity), then the k least influential together; the loss
-- averaged over the same batches as the full model's.
local function removal(s, a)
  local model = s.model
  for i, r in ipairs(s.block_rows) do
    if s.stepwise then r.removal_loss = avg(s, s.sums.layers[i], 'removal_loss') else r.removal_loss = loss_without(s, {r.name}) end
    local block = s.layers[i][2]
    local branch = measure.residual_branch(block)
    if branch then
      -- f zeroed, the wrapper's own path kept: what f itself adds
      r.f_removal_loss = loss_with(s, function()
        return {probe.replace(model, r.name .. '.' .. branch, function(out) return torch.zeros_like(out) end)}
      end)
      local skip = block.skip_module
      if type(skip) == 'string' and type(block[skip]) == 'table' then
        -- the learned path replaced by the identity it stands for, f kept
        r.gate_identity_loss = loss_with(s, function()
          return {probe.replace(model, r.name .. '.' .. skip, function(_, _, input) return input end)}
        end)
      end
    end
  end
  local ranked = {}
  for _, r in ipairs(s.block_rows) do if r.influence then ranked[#ranked + 1] = r end end
  table.sort(ranked, function(p, q) return p.influence < q.influence end)
  local k = math.min(s.opts.k or math.floor(#s.block_rows / 2), #ranked)
  if k > 0 then
    local names = {}
    for i = 1, k do names[i] = ranked[i].name end
    a.removal = {k = k, blocks = names, loss = loss_without(s, names), full_loss = a.loss}
  end
end

-- autopsy.run(model, data, {metrics = {...}, steps = 1, batch = 8, seq, thresholds, k, history, probe_text, config, tokenizer, lens, saes})
-- data: a corpus (batches from its val split), {inputs, targets}, or a
-- list of texts (with tokenizer, or the model's own) or of 1-D ids of any
-- lengths: one batch, padded, in which every statistic, loss and map reads
-- the real positions only (each example predicting its own next tokens).
-- steps: batches to average over. k: how many lowest-influence blocks the
-- removal sweep drops together (default: half). history: a train.fit run
-- whose losses and probe history go into the report. probe_text: a sentence
-- whose attention maps the report shows (with a corpus to encode it).
-- config: the calling script's settings, kept in the provenance record
-- (a.provenance: data, model, training, software, machine; see provenance.lua).
-- lens: a tuned lens of the model (lens.tuned): each block's row gains
-- lens_kl (the logit lens's KL to the final distribution), tuned_lens_loss
-- and tuned_kl (the same read through the tuned lens). saes: SAEs of the
-- model (sae.train, sae.load), each evaluated on the corpus's val split
-- (sae.evaluate): its layer's row gains sae_alive, sae_l0, sae_ev and
-- sae_ce_recovered, how many features the layer uses beside its erank; a
-- sae.CLT fills every layer's row (autopsy/saes.lua).
local function run(model, source, opts)
  probe.require_clean(model, 'autopsy.run', 2)
  opts = options.check(opts, {'metrics', 'steps', 'batch', 'seq', 'thresholds', 'k', 'history', 'probe_text', 'config', 'tokenizer', 'lens',
    'saes'}, 'autopsy.run', 2)
  -- counts checked when given: steps = inf measured batches without end, 0 or
  -- nan none (then failed on the missing last batch), 1.5 divided one batch's sums by 1.5
  for _, key in ipairs{'steps', 'batch', 'seq'} do options.whole(opts[key], key, 'autopsy.run') end
  options.whole(opts.k, 'k', 'autopsy.run', nil, 0)
  if opts.history ~= nil then
    local given = opts
    opts = {}
    for k, v in pairs(given) do opts[k] = v end
    opts.history = args.history_of(opts.history)
  end
  args.check_lens(model, opts.lens)
  local saes = args.check_saes(model, opts.saes, source)
  local padded = args.padded_source(model, source, opts)
  if padded and opts.steps ~= nil and opts.steps ~= 1 then
    error(('autopsy.run: a list of texts is one batch; steps must be 1, got %s'):format(tostring(opts.steps)), 2)
  end
  if padded then source = {padded[1], padded[2]} end
  args.check_tokens(model, source)
  -- this autopsy's own start (or its training run's): several in one script each keep their own date and wall time
  local started, started_utc = native.now(), os.date('!%Y-%m-%dT%H:%M:%SZ')
  if type(opts.history) == 'table' and opts.history.started then started, started_utc = opts.history.started, opts.history.started_utc end
  local s = start(model, source, opts)
  if padded then s.mask, s.idx = padded.mask, padded.idx end
  -- measured in eval mode; the model's modes, hooks, grad mode and its
  -- parameters' .grad (the measuring backward writes them) come back as they
  -- were, after an error too
  local a = probe.scope(model, function()
    measure_batches(s)
    probe_maps(s)
    local a = rows(s)
    if s.want.removal then removal(s, a) end
    moe.run(s, a, loss_with, from_block)  -- the layers holding an nn.MoE (autopsy/moe.lua)
    if s.want.attn_entropy then
      local any = false
      for _, r in ipairs(s.block_rows) do any = any or r.entropy ~= nil end
      if not any then s.missing.entropy = 'no block publishes an attention pattern (an attention block defines keep_pattern(keep, grad) and pattern())' end
    end
    if saes then require('anatomy.autopsy.saes').rows(s, a, saes) end
    a.missing = s.missing
    verdicts.assign(a, s.thresholds)
    return a
  end, {mode = 'eval', grads = true})
  local corpus = getmetatable(source) == data.Corpus and source or nil
  a.provenance = provenance.record{corpus = corpus, model = model, run = opts.history, config = opts.config,
    started = started, started_utc = started_utc}
  return a
end

probe.analysis(run)

return run
