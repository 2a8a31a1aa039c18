-- A sae.CLT measured on a corpus, layer by layer (sae.evaluate of a CLT),
-- and one layer's encoder seen as an SAE, so that sae.top_activations and
-- its feature pages read a CLT's features as they read an SAE's.
-- L layers, D the model's width, F features a layer, N rows (tokens).
local torch = require('anatomy.torch')
local nn = require('anatomy.nn')
local options = require('anatomy.torch.options')
local hooks = require('anatomy.probe.hooks')
local scope = require('anatomy.probe.scope')
local locations = require('anatomy.features.clt_splice').locations

local M = {}

-- Hooks that put each layer's transcoder input and output in xs[l], ys[l]
local function capture(model, locs, xs, ys)
  local hs = {}
  for l, loc in ipairs(locs) do
    if loc.from_module_input and loc.input == loc.output then
      hs[#hs + 1] = hooks.replace(model, loc.output, function(t, _, input) xs[l], ys[l] = input, t end)
    else
      hs[#hs + 1] = hooks.replace(model, loc.input, function(t, _, input) xs[l] = loc.from_module_input and input or t end)
      hs[#hs + 1] = hooks.replace(model, loc.output, function(t) ys[l] = t end)
    end
  end
  return hooks.group(hs)
end

local CLTEvaluation = {}
CLTEvaluation.__index = CLTEvaluation

-- M.evaluate(model, c, corpus, opts, level) -> sae.evaluate of a CLT over
-- consecutive windows of the split: layers[l] = {l0, alive, dead,
-- explained_variance, mse} (layer l's features active per token, how many
-- fired, the share that never did; how much of layer l's MLP output the
-- reconstruction explains); l0 (all layers' features per token),
-- explained_variance (over every layer's output at once), ce_clean,
-- ce_spliced (every MLP output its reconstruction), ce_zero (every MLP
-- output zeroed), ce_recovered, tokens.
function M.evaluate(model, c, corpus, opts, level)
  local where = 'sae.evaluate'
  if type(corpus) ~= 'table' and type(corpus) ~= 'userdata' or not corpus.tokens then
    error(('%s: corpus must be a data.Corpus, got %s'):format(where, type(corpus)), level)
  end
  opts = options.check(opts, {'batches', 'batch', 'seq', 'split'}, where, level)
  local batches = options.whole(opts.batches, 'batches', where, 8)
  local B = options.whole(opts.batch, 'batch', where, 16)
  local trained = c.cfg.trained
  local T = options.whole(opts.seq, 'seq', where, trained and trained.seq or math.min(model:context() or 128, 128))
  local split = opts.split or 'val'
  if split ~= 'val' and split ~= 'train' then error(("%s: split must be 'train' or 'val', got %s"):format(where, tostring(split)), level) end
  local ids = corpus:tokens(split)
  local n = math.min(batches * B, math.floor((ids:numel() - 1) / T))
  if n < 1 then error(('%s: the %s split has %d tokens, fewer than seq + 1 = %d'):format(where, split, ids:numel(), T + 1), level) end
  local x_all, y_all = ids:narrow(1, 1, n * T):view(n, T), ids:narrow(1, 2, n * T):view(n, T)
  local locs = locations(model, c, where, level)
  local L, F, D = c.cfg.n_layers, c.cfg.d_transcoder, c.cfg.d_model
  local device = model:device()
  local on = {dtype = 'float64', device = device}
  local sq_err, sum, sum_sq = torch.zeros(L, on), torch.zeros(L, D, on), torch.zeros(L, on)
  local active, counts, rows = torch.zeros(L, on), torch.zeros(L, F, on), 0
  local ce, tokens = {clean = 0, spliced = 0, zero = 0}, 0
  local ce_of = function(logits, yb) return nn.functional.cross_entropy(logits, yb):item() end
  scope.run(model, function() torch.no_grad(function()
    for first = 1, n, B do
      local b = math.min(B, n - first + 1)
      local xb, yb = x_all:narrow(1, first, b):to(device), y_all:narrow(1, first, b):to(device)
      local xs, ys = {}, {}
      local h = capture(model, locs, xs, ys)
      local clean = ce_of(model(xb), yb)
      h:remove()
      h = require('anatomy.features.clt_splice').attach(model, c, {}, where)
      local spliced = ce_of(model(xb), yb)
      h:remove()
      local zs = {}
      for l, loc in ipairs(locs) do zs[l] = hooks.replace(model, loc.output, function(t) return torch.zeros_like(t) end) end
      h = hooks.group(zs)
      local zeroed = ce_of(model(xb), yb)
      h:remove()
      local k = yb:numel()
      ce.clean, ce.spliced, ce.zero, tokens = ce.clean + clean * k, ce.spliced + spliced * k, ce.zero + zeroed * k, tokens + k
      for l = 1, L do
        xs[l] = xs[l]:reshape({-1, D}):to(c.W_enc.dtype)
        ys[l] = ys[l]:reshape({-1, D}):double()
      end
      local X, Y = torch.stack(xs, 2), torch.stack(ys, 2)  -- (N, L, D)
      local f = c:encode(X)
      local err = c:decode(f, X):double() - Y
      sq_err = sq_err + err:square():sum({1, 3})
      sum, sum_sq = sum + Y:sum(1), sum_sq + Y:square():sum({1, 3})
      local fired = f:gt(0):double()  -- (N, L, F)
      active, counts, rows = active + fired:sum({1, 3}), counts + fired:sum(1), rows + X:size(1)
    end
  end) end, {mode = 'eval'})
  local var = sum_sq - sum:square():sum(2) / rows  -- (L): each layer's Σ‖y − ȳ‖²
  local e = setmetatable({tokens = rows, layers = {}, l0 = active:sum():item() / rows,
    explained_variance = 1 - sq_err:sum():item() / var:sum():item(),
    ce_clean = ce.clean / tokens, ce_spliced = ce.spliced / tokens, ce_zero = ce.zero / tokens, notes = {}}, CLTEvaluation)
  for l = 1, L do
    local alive = counts[l]:gt(0):sum():item()
    local v = var[l]:item()
    e.layers[l] = {l0 = active[l]:item() / rows, alive = alive, dead = 1 - alive / F, mse = sq_err[l]:item() / (rows * D),
      explained_variance = v > 0 and 1 - sq_err[l]:item() / v or nil}
    if v <= 0 then e.notes[#e.notes + 1] = ('layer %d\'s MLP output does not vary: its explained variance means nothing'):format(l) end
  end
  if e.ce_zero - e.ce_clean > 1e-6 then
    e.ce_recovered = (e.ce_zero - e.ce_spliced) / (e.ce_zero - e.ce_clean)
  else
    e.notes[#e.notes + 1] = ('zeroing the MLP outputs does not raise the loss (%.4f zeroed, %.4f clean): CE loss recovered means nothing here'):format(
      e.ce_zero, e.ce_clean)
  end
  return e
end

function CLTEvaluation:__tostring()
  local lines = {('sae.evaluate of a CLT over %d tokens: L0 %.2f (all layers), explained variance %.4f'):format(self.tokens, self.l0,
    self.explained_variance),
    ('  CE loss: clean %.4f, spliced %.4f, every MLP zeroed %.4f, recovered %s'):format(self.ce_clean, self.ce_spliced, self.ce_zero,
      self.ce_recovered and ('%.4f'):format(self.ce_recovered) or 'n/a')}
  for l, r in ipairs(self.layers) do
    lines[#lines + 1] = ('  layer %d: L0 %.2f, %d features alive, explained variance %s'):format(l, r.l0, r.alive,
      r.explained_variance and ('%.4f'):format(r.explained_variance) or 'n/a')
  end
  for _, n in ipairs(self.notes) do lines[#lines + 1] = '  note: ' .. n end
  return table.concat(lines, '\n')
end

-- M.layer(model, c, l, where, level) -> layer l's encoder as sae.top_activations
-- reads an SAE: cfg.point the point it reads (cfg.transcoder: a module's
-- input), encode, and W_dec (F, D): all that each feature writes, summed
-- over the layers it writes to (what it adds to the residual stream, for
-- the page's logit effect).
function M.layer(model, c, l, where, level)
  local L = c.cfg.n_layers
  if type(l) ~= 'number' or l % 1 ~= 0 or l < 1 or l > L then
    error(('%s: layer must be a whole number in 1..%d (the CLT\'s layers) for a sae.CLT, got %s'):format(where, L, tostring(l)), level)
  end
  local loc = locations(model, c, where, level)[l]
  local kind = c.cfg.cross_layer and 'CLT' or 'transcoder set'
  return {cfg = {d_sae = c.cfg.d_transcoder, point = loc.input, transcoder = loc.from_module_input, trained = c.cfg.trained,
      kind = c.cfg.kind, description = ('layer %d of a %s %s, %d features a layer'):format(l, c.cfg.kind, kind, c.cfg.d_transcoder)},
    W_dec = c:decoder(l):sum(2),
    encode = function(_, x) return c:encode_layer(x, l) end}
end

return M
