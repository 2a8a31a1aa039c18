-- An SAE in the model: sae.attach puts its reconstruction in place of the
-- point's activation (with the error term, the activation itself, with the
-- features as hook points between), and sae.evaluate measures how much of
-- the point and of the model's loss the SAE keeps.
-- B batch, T time, D the point's width, F features, N rows.
local torch = require('anatomy.torch')
local nn = require('anatomy.nn')
local options = require('anatomy.torch.options')
local points = require('anatomy.probe.points')
local hooks = require('anatomy.probe.hooks')
local scope = require('anatomy.probe.scope')
local splice = {}

local function check_sae(s, where)
  if type(s) ~= 'table' or not s.cfg or not s.encode then
    error(('%s: s must be an SAE (sae.train, sae.load, sae.new), got %s'):format(where, nn.typename(s)), 3)
  end
end

-- The point an SAE goes in: opts.point, else its own (checked against the
-- model: the name exists and its width is the SAE's d_in happens at the first forward).
local function point_of(model, s, point, where)
  point = point or s.cfg.point
  if type(point) ~= 'string' then
    error(("%s: the SAE names no point; give {point = 'blocks.3.resid_post'}"):format(where), 3)
  end
  local canonical, why = points.canonical(model, point)
  if not canonical then error(('%s: point: %s'):format(where, why), 3) end
  local own_ok, own = pcall(points.canonical, model, s.cfg.point or '')
  if canonical == s.cfg.point or (own_ok and canonical == own) then
    s.cfg.hook_name = s.cfg.hook_name or points.to_transformer_lens(model, canonical)  -- what sae:save writes for SAELens
  end
  local _, _, hook = points.locate(model, canonical, 2)
  if s.cfg.transcoder and hook then
    error(("%s: a transcoder goes in place of a module's output; '%s' is a hook point"):format(where, canonical), 3)
  end
  if s.cfg.transcoder and s.cfg.hook_name_out then  -- what it was trained to write must be that module's output
    local ok, out = pcall(points.canonical, model, s.cfg.hook_name_out)
    if ok and out and out ~= canonical then
      error(("%s: the transcoder writes %s ('%s' here), which is not the output of '%s' (a norm between them?); "
        .. "anatomy splices a transcoder in place of one module's output"):format(where, s.cfg.hook_name_out, out, canonical), 3)
    end
  end
  return canonical, hook ~= nil
end

local function check_width(s, t, point)
  if t:size(-1) ~= s.cfg.d_in then
    error(("sae.attach: the activation at '%s' is %s wide; the SAE's d_in is %d"):format(point, t:size(-1), s.cfg.d_in), 0)
  end
end

-- sae.attach(model, s, {error_term = false, point}) -> handle. The point's
-- activation x is replaced by the reconstruction x̂ = decode(encode(x)); a
-- transcoder's module output by the reconstruction from the module's input.
-- Its features are the hook point '<point>.sae.acts' (B, T, F) and x − x̂
-- is '<point>.sae.error': run_with_cache records them, probe.replace,
-- ablation, patching and attribution act on them like on any point. With
-- error_term = true the output is x̂ + (x − x̂) of the same run: exactly x
-- while nothing changes the features (the model's logits are the clean
-- ones, bit for bit), and a change to the features moves it by the change
-- of x̂. handle:remove() or probe.clear(model) takes it out.
-- An SAE already spliced at one of these points: a second would read the
-- first's reconstruction (a notebook cell run twice). Refused, naming the
-- point and how to take the first out.
function splice.refuse_stacked(model, at, where, level)
  local want = {}
  for _, p in ipairs(at) do want[p] = true end
  for _, e in ipairs(hooks.list(model)) do
    if e.kind == 'SAE' and want[e.at] then
      error(("%s: %s already has an SAE spliced in, and a second would read the first's reconstruction; "
        .. 'take the first out with its handle\'s :remove() or probe.clear(model)'):format(where, e.at), level + 1)
    end
  end
end

function splice.attach(model, s, opts)
  local where = 'sae.attach'
  check_sae(s, where)
  opts = options.check(opts, {'error_term', 'point'}, where, 2)
  if opts.error_term ~= nil and type(opts.error_term) ~= 'boolean' then
    error(('%s: error_term must be true or false, got %s'):format(where, tostring(opts.error_term)), 2)
  end
  local point, is_hook = point_of(model, s, opts.point, where)
  local error_term = opts.error_term == true
  splice.refuse_stacked(model, {point}, where, 2)
  local owner, _, hook = points.locate(model, point, 1)
  local prefix = hook and (hook .. '.') or ''
  local acts_name, error_name = point .. '.sae.acts', point .. '.sae.error'
  local function splice_in(t, input)
    local x = s.cfg.transcoder and input or t
    check_width(s, x, point)
    local f = s:encode(x)
    local published = hooks.publish(owner, acts_name, f)
    local recon = s:reconstruct(f, x)  -- decode(f), and a skip transcoder's x W_skipᵀ
    local raw_err = t - recon
    local err = hooks.publish(owner, error_name, raw_err)
    local changed = not rawequal(published, f)
    if not error_term then return changed and s:reconstruct(published, x) or recon end
    if not changed and rawequal(err, raw_err) then
      if not torch.is_grad_enabled() then return t end
      return t + (recon - recon:detach())  -- the value of t exactly; the gradient reaches the features
    end
    return (changed and s:reconstruct(published, x) or recon) + err
  end
  local handle
  if is_hook then
    handle = hooks.replace(model, point, function(t) return splice_in(t) end)
  else
    handle = hooks.replace(model, point, function(t, _, input) return splice_in(t, input) end)
  end
  handle.attached[1][2].publishes = {prefix .. 'sae.acts', prefix .. 'sae.error'}
  handle.attached[1][2].sae = s
  return handle
end

-- The val split cut into windows of T + 1 tokens, one after another (the
-- same windows every call): ids (n, T) and next tokens (n, T).
local function windows(corpus, split, T, n, where)
  local ids = corpus:tokens(split)
  local have = math.floor((ids:numel() - 1) / T)
  if have < 1 then error(('%s: the %s split has %d tokens, fewer than seq + 1 = %d'):format(where, split, ids:numel(), T + 1), 3) end
  n = math.min(n, have)
  local x = ids:narrow(1, 1, n * T):view(n, T)
  local y = ids:narrow(1, 2, n * T):view(n, T)
  return x, y
end

local Evaluation = {}
Evaluation.__index = Evaluation

-- sae.evaluate(model, s, corpus, {batches = 8, batch = 16, seq, split =
-- 'val', point}) -> an Evaluation over consecutive windows of the split:
-- l0 (features active per token), explained_variance (1 − Σ‖x − x̂‖² /
-- Σ‖x − x̄‖²), mse (per element), ce_clean, ce_spliced (the reconstruction in
-- place of the activation), ce_zero (the activation zeroed), ce_recovered
-- ((ce_zero − ce_spliced) / (ce_zero − ce_clean); nil with a note where
-- zeroing the point does not raise the loss), dead (share of features that
-- never fire on these tokens), dense (share firing on more than 10% of
-- them), density (F, each feature's share of tokens), histogram (of log10
-- density over the live features), tokens. s a sae.CLT: its numbers layer
-- by layer and the loss with every MLP replaced (features/clt_eval.lua).
function splice.evaluate(model, s, corpus, opts)
  local where = 'sae.evaluate'
  if nn.typename(s) == 'sae.CLT' then  -- layer by layer: features/clt_eval.lua
    local e = require('anatomy.features.clt_eval').evaluate(model, s, corpus, opts, 3)
    return e
  end
  check_sae(s, where)
  if type(corpus) ~= 'table' and type(corpus) ~= 'userdata' or not corpus.tokens then
    error(('%s: corpus must be a data.Corpus, got %s'):format(where, type(corpus)), 2)
  end
  opts = options.check(opts, {'batches', 'batch', 'seq', 'split', 'point'}, where, 2)
  local batches = options.whole(opts.batches, 'batches', where, 8)
  local B = options.whole(opts.batch, 'batch', where, 16)
  local T = options.whole(opts.seq, 'seq', where, s.cfg.trained and s.cfg.trained.seq or math.min(model:context() or 128, 128))
  local split = opts.split or 'val'
  if split ~= 'val' and split ~= 'train' then error(("%s: split must be 'train' or 'val', got %s"):format(where, tostring(split)), 2) end
  local point = point_of(model, s, opts.point, where)
  local x_all, y_all = windows(corpus, split, T, batches * B, where)
  local D, F = s.cfg.d_in, s.cfg.d_sae
  local device = model:device()  -- the corpus's windows are on the CPU; each batch goes to the model
  local sq_err, sum, sum_sq, n_rows, active = 0, torch.zeros(D, {dtype = 'float64', device = device}), 0, 0, 0
  local counts = torch.zeros(F, {dtype = 'float64', device = device})
  local ce = {clean = 0, spliced = 0, zero = 0}
  local tokens = 0
  scope.run(model, function() torch.no_grad(function()
    for first = 1, x_all:size(1), B do
      local n = math.min(B, x_all:size(1) - first + 1)
      local xb, yb = x_all:narrow(1, first, n):to(device), y_all:narrow(1, first, n):to(device)
      local act_in, act_out
      local h = hooks.replace(model, point, function(t, _, input)
        act_in, act_out = s.cfg.transcoder and input or t, t
      end)
      local clean = nn.functional.cross_entropy((model(xb)), yb):item()
      h:remove()
      local spliced_handle = splice.attach(model, s, {point = point})
      local spliced = nn.functional.cross_entropy((model(xb)), yb):item()
      spliced_handle:remove()
      local zero_handle = hooks.replace(model, point, function(t) return torch.zeros_like(t) end)
      local zeroed = nn.functional.cross_entropy((model(xb)), yb):item()
      zero_handle:remove()
      local k = yb:numel()
      ce.clean, ce.spliced, ce.zero, tokens = ce.clean + clean * k, ce.spliced + spliced * k, ce.zero + zeroed * k, tokens + k
      local xin = act_in:reshape({-1, D}):float()
      local target = act_out:reshape({-1, act_out:size(-1)}):double()
      local f = s:encode(xin)
      local recon = s:reconstruct(f, xin):double()
      sq_err = sq_err + (recon - target):square():sum():item()
      sum = sum + target:sum(1)
      sum_sq = sum_sq + target:square():sum():item()
      n_rows = n_rows + target:size(1)
      local on = f:gt(0)
      active = active + on:double():sum():item()
      counts = counts + on:double():sum(1)
    end
  end) end, {mode = 'eval'})
  local total_var = sum_sq - (sum:square():sum():item()) / n_rows
  local density = counts / n_rows
  local e = setmetatable({point = point, tokens = n_rows, l0 = active / n_rows, mse = sq_err / (n_rows * D),
    explained_variance = total_var > 0 and 1 - sq_err / total_var or nil,
    ce_clean = ce.clean / tokens, ce_spliced = ce.spliced / tokens, ce_zero = ce.zero / tokens,
    density = density:float(), dead = density:eq(0):double():mean():item(), dense = density:gt(0.1):double():mean():item(),
    notes = {}}, Evaluation)
  if e.ce_zero - e.ce_clean > 1e-6 then
    e.ce_recovered = (e.ce_zero - e.ce_spliced) / (e.ce_zero - e.ce_clean)
  else
    e.notes[#e.notes + 1] = ('zeroing %s does not raise the loss (%.4f zeroed, %.4f clean): CE loss recovered means nothing here'):format(
      point, e.ce_zero, e.ce_clean)
  end
  if total_var <= 0 then e.notes[#e.notes + 1] = 'the activations do not vary: explained variance means nothing here' end
  -- log10 density of the live features, half-decade bins from 1e-6 (and below) to 1
  local edges, bins = {}, {}
  for i = 0, 12 do edges[i + 1] = -6 + 0.5 * i end
  for i = 1, 12 do bins[i] = 0 end
  for _, d in ipairs(density:tolist()) do
    if d > 0 then
      local i = math.max(1, math.min(12, math.floor((math.log10(d) + 6) / 0.5) + 1))
      bins[i] = bins[i] + 1
    end
  end
  e.histogram = {edges = edges, counts = bins}
  return e
end

function Evaluation:__tostring()
  local lines = {('sae.evaluate at %s over %d tokens'):format(self.point, self.tokens),
    ('  L0 %.2f   explained variance %s   MSE %.4g'):format(self.l0,
      self.explained_variance and ('%.4f'):format(self.explained_variance) or 'n/a', self.mse),
    ('  CE loss: clean %.4f, spliced %.4f, zeroed %.4f, recovered %s'):format(self.ce_clean, self.ce_spliced, self.ce_zero,
      self.ce_recovered and ('%.4f'):format(self.ce_recovered) or 'n/a'),
    ('  features: %.1f%% dead, %.1f%% dense (on > 10%% of tokens)'):format(100 * self.dead, 100 * self.dense)}
  for _, n in ipairs(self.notes) do lines[#lines + 1] = '  note: ' .. n end
  return table.concat(lines, '\n')
end

return splice
