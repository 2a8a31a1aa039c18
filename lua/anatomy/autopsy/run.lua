-- autopsy.run: measures a model on a few batches (one forward and backward
-- each, every layer's input and output recorded), reads the logit lens,
-- removes blocks one at a time, and returns an Autopsy with a row per layer.
local probe = require 'anatomy.probe'
local nn = require 'anatomy.nn'
local measure = require 'anatomy.autopsy.measure'
local verdicts = require 'anatomy.autopsy.verdicts'
local Autopsy = require 'anatomy.autopsy.Autopsy'
local provenance = require 'anatomy.io.provenance'
local data = require 'anatomy.data'
local inputs = require 'anatomy.probe.inputs'

-- autopsy.run(model, batch_or_corpus, {metrics = {...}, steps = 1, batch = 8, seq, thresholds, k, history, probe_text})
-- batch_or_corpus: a corpus (batches from its val split) or {inputs, targets}.
-- steps: batches to average over. k: how many lowest-influence blocks the
-- removal sweep drops together (default: half). history: a train.fit run
-- whose losses and probe history go into the report. probe_text: a sentence
-- whose attention maps the report shows (with a corpus to encode it).
-- config: the calling script's settings, kept in the provenance record
-- (a.provenance: data, model, training, software, machine; see provenance.lua).
local function run(model, source, opts)
  opts = opts or {}
  -- this autopsy's own start (or its training run's): several in one script each keep their own date and wall time
  local started, started_utc = torch._now(), os.date('!%Y-%m-%dT%H:%M:%SZ')
  if type(opts.history) == 'table' and opts.history.started then started, started_utc = opts.history.started, opts.history.started_utc end
  local want = {}
  for _, m in ipairs(opts.metrics or measure.all_metrics) do want[m] = true end
  local thresholds = {}
  for k, v in pairs(verdicts.thresholds) do thresholds[k] = (opts.thresholds or {})[k] or v end
  local layers = measure.layers(model)
  local seq = opts.seq or model:context() or 64
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
  local maps, map_tokens = {}, nil           -- every head's map (H, T', T') of the first sequence, T' <= 32, and its tokens
  local function keep_maps(name, pattern, ids)
    local T = math.min(pattern:size(3), 32)
    maps[name] = pattern[1]:narrow(2, 1, T):narrow(3, 1, T):float():clone()
    map_tokens = inputs.token_texts(ids:narrow(1, 1, T):unsqueeze(1), source)[1]
  end
  local stepwise = type(model.hidden_from) == 'function' and type(model.readout) == 'function'
  -- head_loss(h (B, T, C), y, top) -> the mean cross-entropy of readout(h)
  -- against y, and (with top) the share of positions whose top token is top's
  local function head_loss(h, y, top)
    return torch.no_grad(function()
      local logits = model:readout(h)
      local ce = nn.functional.cross_entropy(logits, y):item()
      return ce, top and logits:argmax(-1):eq(top):double():mean():item() or nil
    end)
  end
  local seen_batches = {}
  local missing = {}        -- column -> why it has no numbers (printed under the table)
  local patterns_text
  for _ = 1, steps do
    local x, y = batch()
    local d = measure.dissect(model, layers, x, y)
    last = {x = x, y = y, d = d}
    -- with the stepwise shortcut, each block's input too: the sweep below
    -- runs from the first block it removes
    local inputs = {}
    if stepwise and want.removal then
      for j = 1, #layers do inputs[j] = d.io[j] and d.io[j].input end
    end
    seen_batches[#seen_batches + 1] = {x, y, inputs = inputs}
    add('loss', d.loss)
    for name, p in model:named_parameters() do
      if p.grad ~= nil then add('grad:' .. name, p.grad:norm():item()) end
    end
    local final_top = d.logits:argmax(-1)
    local eranks_of = {}   -- {layer, (tokens, C)}: one batched call below
    -- a model with hidden_from(i, h) (the model protocol): its last layer's
    -- lens is the forward's own logits, and removing layer j reruns only
    -- layers j+1..N from the input j read (removing the last is the lens of
    -- the one before it)
    local lens_ce = {}
    for i, l in ipairs(layers) do
      local rec = d.io[i]
      if rec then
        local inp, out = rec.input, rec.output
        local stats = torch.metrics.activation_stats(out)
        add(i .. ':act_mean', stats.mean)
        add(i .. ':act_std', stats.std)
        add(i .. ':act_max', stats.max_abs)
        add(i .. ':act_rms', stats.rms)
        if want.erank then eranks_of[#eranks_of + 1] = {i, out:reshape(-1, out:size(-1))} end
        if inp and table.concat(inp:size(), 'x') == table.concat(out:size(), 'x') then
          local in_std = torch.metrics.activation_stats(inp).std
          add(i .. ':amplification', stats.std / math.max(in_std, 1e-30))
          if want.residual then add(i .. ':residual', torch.metrics.residual_ratio(inp, out)) end
          if want.influence then add(i .. ':influence', torch.metrics.block_influence(inp, out)) end
        end
        if rec.branch and table.concat(rec.branch:size(), 'x') == table.concat(out:size(), 'x') then
          -- a wrapper's own path (gate(x)) is out - f(x): f's share is measured beside it, not beside x
          local skip = out - rec.branch
          add(i .. ':f_residual', torch.metrics.residual_ratio(skip, out))
          add(i .. ':f_influence', torch.metrics.block_influence(skip, out))
        end
        if want.logit_lens and model.readout then
          local ok, lens, agree = true, d.logits, nil
          if stepwise and i < #layers then
            ok, lens, agree = pcall(head_loss, out, y, final_top)
            if ok then lens_ce[i] = lens end
          elseif not stepwise or i ~= #layers then
            ok, lens = pcall(function() return torch.no_grad(function() return model:readout(out) end) end)
          end
          if ok and lens_ce[i] then
            add(i .. ':lens_loss', lens_ce[i])
            add(i .. ':lens_agree', agree)
          elseif ok and torch.is_tensor(lens) and lens:size(-1) == d.logits:size(-1) then
            lens_ce[i] = nn.functional.cross_entropy(lens, y):item()
            add(i .. ':lens_loss', lens_ce[i])
            add(i .. ':lens_agree', lens:argmax(-1):eq(final_top):double():mean():item())
          elseif not ok then
            missing.lens_loss = missing.lens_loss or ('readout(h) failed: ' .. tostring(lens):gsub('^[^\n]-:%d+: ', ''):match('[^\n]*'))
          else
            missing.lens_loss = missing.lens_loss or ('readout(h) gave %s, not logits over %d tokens'):format(
              torch.is_tensor(lens) and table.concat(lens:size(), 'x') or type(lens), d.logits:size(-1))
          end
        elseif want.logit_lens then
          missing.lens_loss = ('%s has no readout(h) (the head applied to a hidden state)'):format(nn.typename(model))
        end
      end
      if want.attn_entropy then
        for name, pattern in pairs(d.patterns) do
          if name ~= 'grads' and measure.starts_with(name, l[1] .. '.') then
            local mean, heads = torch.metrics.attention_entropy(pattern)
            add(i .. ':entropy', mean)
            -- per head, summed over the batches like the table's column (divided below): one set of batches for both
            local sum = entropy_heads[l[1]]
            entropy_heads[l[1]] = sum and (sum + heads:double()) or heads:double()
            local T = math.min(pattern:size(3), 24)
            patterns[l[1]] = pattern[1][1]:narrow(1, 1, T):narrow(2, 1, T):tolist()
            keep_maps(l[1], pattern, x[1])
            add(i .. ':diag', torch.metrics.diagonal_mass(pattern))
            break
          end
        end
      end
    end
    if #eranks_of > 0 then
      local list = {}
      for k, e in ipairs(eranks_of) do list[k] = e[2] end
      for k, r in ipairs(torch.metrics.eranks(list)) do add(eranks_of[k][1] .. ':erank', r) end
    end
    if want.removal and stepwise then
      for j = 1, #layers do
        local ce = j == #layers and j > 1 and lens_ce[j - 1]
        if not ce and d.io[j] and torch.is_tensor(d.io[j].input) then
          local ok, loss = pcall(function()
            return head_loss(torch.no_grad(function() return model:hidden_from(j + 1, d.io[j].input) end), y)
          end)
          if ok then
            ce = loss
          else
            missing.removal_loss = missing.removal_loss or ('removing a block failed: ' .. tostring(loss):match('[^\n]*'))
          end
        end
        if ce then add(j .. ':removal_loss', ce) end
      end
    end
  end
  local function avg(key) return acc[key] and acc[key] / steps end
  for name, sum in pairs(entropy_heads) do entropy_heads[name] = (sum / steps):tolist() end

  -- attention maps for a probe sentence, when one is given (else the first validation window)
  if opts.probe_text and type(source) == 'table' and source.encode then
    local ok, ids = pcall(source.encode, source, opts.probe_text)
    if ok and ids:numel() > 1 then
      ids = ids:narrow(1, 1, math.min(ids:numel(), seq)):unsqueeze(1):to(model:device())  -- encoded on the CPU
      local cap = probe.capture(model, {filter = '*.pattern'}, function() torch.no_grad(function() model(ids) end) end)
      for _, l in ipairs(layers) do
        for name, pattern in pairs(cap) do
          if name ~= 'grads' and measure.starts_with(name, l[1] .. '.') then
            local T = math.min(pattern:size(3), 24)
            patterns[l[1]] = pattern[1][1]:narrow(1, 1, T):narrow(2, 1, T):tolist()
            keep_maps(l[1], pattern, ids[1])
          end
        end
      end
      patterns_text = opts.probe_text
    end
  end

  -- rows: the input (embedding), each layer, the output (everything after the stack)
  local a = setmetatable({model = nn.typename(model), loss = avg('loss'), rows = {}, params = {}, weights = {},
    thresholds = thresholds, metrics = opts.metrics or measure.all_metrics, history = opts.history,
    entropy_heads = entropy_heads, patterns = patterns, patterns_text = patterns_text, attention_maps = maps,
    attention_tokens = map_tokens}, Autopsy)
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
      entropy = avg(i .. ':entropy'), diag = avg(i .. ':diag'), lens_loss = avg(i .. ':lens_loss'), lens_agree = avg(i .. ':lens_agree'),
      f_residual = avg(i .. ':f_residual'), f_influence = avg(i .. ':f_influence')}
    -- a gated residual: the gate's gradient, and how far the gate is from the identity it replaced
    if nn.is_instance(l[2], nn.Gate) then
      local W = l[2].gate.weight
      block_rows[i].gate_grad = avg('grad:' .. l[1] .. '.gate.weight')
      block_rows[i].gate_identity = (W:detach():double() - torch.eye(W:size(1), {dtype = 'float64'})):norm():item() / math.sqrt(W:size(1))
    end
    if rawget(model, 'hf_config') then  -- the checkpoint's spelling of the row (a:attention takes either)
      local hf = probe.checkpoint_spelling(model, l[1])
      if hf ~= l[1] then block_rows[i].hf_name = hf end
    end
    local dim = last.d.io[i] and last.d.io[i].output:size(-1)
    if block_rows[i].erank and dim then block_rows[i].erank_ratio = block_rows[i].erank / dim end
  end
  local weight_eranks = {}  -- every 2-D weight's, in one batched call
  if want.weight_erank then
    local list, names = {}, {}
    for name, p in model:named_parameters() do
      if p:dim() == 2 then list[#list + 1] = p; names[#list] = name end
    end
    for k, r in ipairs(#list > 0 and torch.metrics.eranks(list) or {}) do weight_eranks[names[k]] = r end
  end
  for name, p in model:named_parameters() do
    local g = avg('grad:' .. name)
    a.params[#a.params + 1] = {name = name, grad_norm = g, shape = table.concat(p:size(), 'x')}
    local r = weight_eranks[name]
    if r then
      a.weights[#a.weights + 1] = {name = name, erank = r, ratio = r / math.min(p:size(1), p:size(2)), shape = table.concat(p:size(), 'x')}
    end
    local row = output_row
    for i, l in ipairs(layers) do if measure.starts_with(name, l[1] .. '.') then row = block_rows[i] end end
    if row == output_row and first_child and measure.starts_with(name, first_child .. '.') then row = input_row end
    if g then row.grads[#row.grads + 1] = g end
  end
  a.rows[1] = input_row
  for _, r in ipairs(block_rows) do a.rows[#a.rows + 1] = r end
  a.rows[#a.rows + 1] = output_row
  for _, r in ipairs(a.rows) do r.grad_norm = #r.grads > 0 and measure.l2(r.grads) or nil end

  -- removal sweep: each block skipped in turn, then the k least influential
  -- together; the loss is averaged over the same batches as the full model's
  if want.removal then
    -- the loss over the measured batches with the interventions attach()
    -- makes; batch_loss(b): one batch's (default: the whole forward's)
    local function loss_with(attach, batch_loss)
      batch_loss = batch_loss or function(b) return nn.functional.cross_entropy(model(b[1]), b[2]):item() end
      local hs = attach()
      local ok, total = pcall(function()
        return torch.no_grad(function()
          local sum = 0
          for _, b in ipairs(seen_batches) do sum = sum + batch_loss(b) end
          return sum / #seen_batches
        end)
      end)
      for _, h in ipairs(hs) do h:remove() end
      if not ok then missing.removal_loss = missing.removal_loss or ('removing a block failed: ' .. tostring(total):match('[^\n]*')) end
      return ok and total or nil
    end
    local index = {}
    for i, l in ipairs(layers) do index[l[1]] = i end
    local function loss_without(names)
      local function skips()
        local hs = {}
        for _, n in ipairs(names) do hs[#hs + 1] = probe.skip(model, n) end
        return hs
      end
      -- stepwise: from the input of the first block removed (the layers
      -- before it run as in the measured forward), every batch's kept
      local first = math.huge
      for _, n in ipairs(names) do first = math.min(first, index[n] or -math.huge) end
      local from_stream = stepwise and first >= 1 and first < math.huge
      for _, b in ipairs(seen_batches) do from_stream = from_stream and torch.is_tensor(b.inputs[first]) end
      return loss_with(skips, from_stream and function(b) return head_loss(model:hidden_from(first, b.inputs[first]), b[2]) end or nil)
    end
    for i, r in ipairs(block_rows) do
      if stepwise then r.removal_loss = avg(i .. ':removal_loss') else r.removal_loss = loss_without({r.name}) end
      local block = layers[i][2]
      local branch = measure.residual_branch(block)
      if branch then
        -- f zeroed, the wrapper's own path kept: what f itself adds
        r.f_removal_loss = loss_with(function()
          return {probe.replace(model, r.name .. '.' .. branch, function(out) return torch.zeros_like(out) end)}
        end)
        local skip = block.skip_module
        if type(skip) == 'string' and type(block[skip]) == 'table' then
          -- the learned path replaced by the identity it stands for, f kept
          r.gate_identity_loss = loss_with(function()
            return {probe.replace(model, r.name .. '.' .. skip, function(_, _, input) return input end)}
          end)
        end
      end
    end
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

  if want.attn_entropy then
    local any = false
    for _, r in ipairs(block_rows) do any = any or r.entropy ~= nil end
    if not any then missing.entropy = 'no block publishes an attention pattern (an attention block defines keep_pattern(keep, grad) and pattern())' end
  end
  a.missing = missing
  verdicts.assign(a, thresholds)
  model:train(was_training)
  local corpus = getmetatable(source) == data.Corpus and source or nil
  a.provenance = provenance.record{corpus = corpus, model = model, run = opts.history, config = opts.config,
    started = started, started_utc = started_utc}
  return a
end

return run
