-- probe.linear: linear probes on cached activations, one per layer. What a
-- layer holds linearly about a label: a logistic regression (class labels)
-- or a linear regression (real-valued labels) trained on the activations at
-- a hook point of every chosen layer, scored on held-out examples. With
-- control = true, the same probe is trained on a control task (Hewitt and
-- Liang, 2019: each token type given a random label, drawn once from the
-- labels' own distribution), and selectivity = accuracy - control accuracy
-- says how much of the accuracy is the layer's rather than the probe's
-- capacity to memorise token types.
local torch = require('anatomy.torch')
local inputs = require('anatomy.probe.inputs')
local points = require('anatomy.probe.points')
local Cache = require('anatomy.probe.cache')
local options = require('anatomy.torch.options')
local format = require('anatomy.render.format')
local charts = require('anatomy.render.charts')
local Adam = require('anatomy.optim.Adam')
local nn = require('anatomy.nn')

local linear = {}
local Probes = {}
Probes.__index = Probes
Probes.__typename = 'probe.LinearProbes'
linear.LinearProbes = Probes

local whole = options.whole

local function number_in(v, name, where, default, lo, hi, open_lo)
  if v == nil then return default end
  if type(v) ~= 'number' or v ~= v or v > hi or v < lo or (open_lo and v == lo) then
    error(('%s: %s must be a number in %s%g, %g], got %s'):format(where, name, open_lo and '(' or '[', lo, hi, tostring(v)), 3)
  end
  return v
end

-- lcg(seed) -> random(n): whole numbers 1..n from the Park-Miller minimal
-- standard generator (exact in doubles), seeded; the probe's own stream.
local function lcg(seed)
  local state = (seed % 2147483646) + 1
  return function(n)
    state = (state * 16807) % 2147483647
    return math.floor((state - 1) / 2147483646 * n) + 1
  end
end

-- The rows probed: {{name, point}, ...}. layers: 'all' (with point
-- 'resid_post', row 0 'embed' is the first layer's resid_pre), or a list of
-- layer numbers (0 for embed with resid_post) or names.
local function rows_of(model, point, layers, where)
  local low = point == 'resid_post' and 0 or 1
  local chosen, all = points.pick_layers(model, layers ~= 'all' and layers or nil, where, 3, low)
  local out = {}
  for _, i in ipairs(chosen) do
    local name, full = i == 0 and 'embed' or all[i][1], i == 0 and all[1][1] .. '.resid_pre' or all[i][1] .. '.' .. point
    local ok, why_not = pcall(points.locate, model, full, 1)
    if not ok then
      error(("%s: %s has no '%s' (%s)"):format(where, i == 0 and all[1][1] or all[i][1], i == 0 and 'resid_pre' or point,
        tostring(why_not):gsub('^[^\n]-:%d+: ', '')), 3)
    end
    out[#out + 1] = {layer = i, name = name, point = full}
  end
  return out
end

-- The labelled positions: indices into B * T, and their labels (N). labels
-- (B, T) per position, or (B) per example read at `position` (of its real
-- tokens); mask (B, T) bool picks positions; padding is never labelled.
local function labelled(labels, ids, pad, opts, where)
  local B, T = ids:size(1), ids:size(2)
  if not torch.is_tensor(labels) then error(('%s: labels must be a Tensor, got %s'):format(where, type(labels)), 3) end
  local classes = labels.dtype == 'int64' or labels.dtype == 'int32'
  if not classes and labels.dtype ~= 'float32' and labels.dtype ~= 'float64' then
    error(('%s: labels must be integer classes (int64) or real values (float), got %s'):format(where, labels.dtype), 3)
  end
  local device = ids.device  -- the model's: the labels and every index follow the activations there
  labels = labels:to(device)
  local real = pad or torch.ones(B, T, {dtype = 'bool', device = device})
  local keep, y
  if labels:dim() == 1 then
    if labels:size(1) ~= B then error(('%s: labels (B) must have one per example: %d examples, %d labels'):format(where, B, labels:size(1)), 3) end
    if opts.mask ~= nil then error(('%s: mask is for per-position labels (B, T); these are one per example'):format(where), 3) end
    local counts = real:long():sum(2):tolist()
    keep = {}
    for b = 1, B do
      local first = pad and real[b]:long():argmax():item() or 1  -- 1-based: the first real token
      local p = inputs.position(opts.position or -1, counts[b], where, 'an example of ' .. counts[b] .. ' tokens', 4)
      -- the p-th real token: padding on the left shifts it
      keep[b] = (b - 1) * T + (first - 1) + p
    end
    keep = torch.tensor(keep, {dtype = 'int64', device = device})
    y = labels
  else
    if labels:dim() ~= 2 or labels:size(1) ~= B or labels:size(2) ~= T then
      error(('%s: labels must be (B, T) = %s as the ids, or (B), got %s'):format(where, format.shape(ids), format.shape(labels)), 3)
    end
    if opts.position ~= nil then error(('%s: position is for one label per example (B); these are per position'):format(where), 3) end
    if opts.mask ~= nil then
      if not torch.is_tensor(opts.mask) or opts.mask.dtype ~= 'bool' or format.shape(opts.mask) ~= format.shape(ids) then
        error(('%s: mask must be a (B, T) = %s bool Tensor, got %s'):format(where, format.shape(ids),
          torch.is_tensor(opts.mask) and (opts.mask.dtype .. ' ' .. format.shape(opts.mask)) or type(opts.mask)), 3)
      end
      real = real:logical_and(opts.mask:to(device))
    end
    local idx = {}
    for k, r in ipairs(real:reshape(-1):tolist()) do if r then idx[#idx + 1] = k end end
    if #idx == 0 then error(('%s: no position is labelled (the mask and padding leave none)'):format(where), 3) end
    keep = torch.tensor(idx, {dtype = 'int64', device = device})
    y = labels:reshape(-1):index_select(1, keep)
  end
  if classes then
    y = y:long()
    if y:min():item() < 1 then error(('%s: class labels must be 1 or more, got %d (leave positions out with mask)'):format(where, y:min():item()), 3) end
  elseif not y:isfinite():all():item() then
    error(('%s: labels hold NaN or infinite values at labelled positions'):format(where), 3)
  end
  return keep, y, classes
end

-- One probe: x (N, C) features, y (N) labels; train on idx_train, score on
-- idx_test. Full-batch Adam from zero weights on the standardised features
-- (mean and std of the training rows): cross-entropy (classes) or mean
-- squared error of the standardised values, plus weight_decay / 2 * |W|^2.
local function fit(x, y, K, train_idx, test_idx, cfg)
  local xt, yt = x:index_select(1, train_idx), y:index_select(1, train_idx)
  local y_mean, y_std = 0, 1
  if not cfg.classes then  -- values: fitted standardised (the training rows' mean and std), scored in their own units
    y_mean = yt:mean():item()
    y_std = math.sqrt(((yt - y_mean) ^ 2):mean():item()) + 1e-5
    yt = (yt - y_mean) / y_std
  end
  local mean = xt:mean(1)
  local std = ((xt - mean) * (xt - mean)):mean(1):sqrt() + 1e-5
  local function z(t) return (t - mean) / std end
  local C = x:size(2)
  local W = torch.zeros(K, C, {dtype = x.dtype, device = x.device}):requires_grad_(true)
  local b = torch.zeros(K, {dtype = x.dtype, device = x.device}):requires_grad_(true)
  local opt = Adam({W, b}, {lr = cfg.lr})
  local zt = z(xt)
  local function objective(logits, target)
    local loss
    if cfg.classes then loss = nn.functional.cross_entropy(logits, target)
    else loss = ((logits:squeeze(2) - target) ^ 2):mean() end
    return loss
  end
  local loss
  for _ = 1, cfg.steps do
    opt:zero_grad()
    loss = objective(zt:matmul(W:t()) + b, yt) + (W * W):sum() * (cfg.weight_decay / 2)
    loss:backward()
    opt:step()
  end
  local out = {}
  torch.no_grad(function()
    local function score(rows, target)
      local pred = z(x:index_select(1, rows)):matmul(W:t()) + b
      if cfg.classes then return pred:argmax(-1):eq(target):double():mean():item() end
      local t = target:double()
      local resid = ((pred:squeeze(2):double() * y_std + y_mean - t) ^ 2):sum():item()
      local total = ((t - t:mean()) ^ 2):sum():item()
      return total > 0 and 1 - resid / total or 0 / 0  -- R^2
    end
    out.train_loss = (objective(zt:matmul(W:t()) + b, yt) + (W * W):sum() * (cfg.weight_decay / 2)):item()
    out.train_score = score(train_idx, y:index_select(1, train_idx))
    out.test_score = score(test_idx, y:index_select(1, test_idx))
  end)
  out.weight, out.bias, out.mean, out.std = W:detach(), b:detach(), mean, std
  return out
end

-- probe.linear(model, input, labels, {point = 'resid_post', layers = 'all',
-- control = false, split = 0.8, seed = 0, steps = 300, lr = 0.01,
-- weight_decay = 1e-4, mask, position, tokenizer, padding_side}) -> probes:
-- a linear probe per layer on the activations at `point` (row 0, 'embed',
-- is the first layer's resid_pre when point is 'resid_post').
-- input: ids (B, T), texts or lists of ids (padded; padding is never
-- labelled). labels: (B, T) int64 classes (1..K) or float values per
-- position (mask (B, T) bool picks the labelled ones), or (B) per example
-- read at `position` (1-based among its real tokens, -1 the last).
-- Examples (not positions) are split: a seeded permutation, the first
-- `split` of them to train. Each probe is a logistic regression (classes)
-- or linear regression (values) on standardised features, full-batch Adam
-- from zero weights. probes.rows[i] = {layer, name, train_loss, train_acc,
-- test_acc (R^2 for values), chance (the majority class's share of the
-- test labels), control_acc, selectivity}; probes.weights[i] = {weight,
-- bias, mean, std}; probes.train_examples (the examples trained on),
-- probes.positions (the labelled positions, 1-based into B * T),
-- probes.labels (their classes, 1..K) and probes.control_labels.
function linear.probe(model, input, labels, opts)
  local where = 'probe.linear'
  opts = options.check(opts, {'point', 'layers', 'control', 'split', 'seed', 'steps', 'lr', 'weight_decay', 'mask', 'position',
    'tokenizer', 'padding_side'}, where, 2)
  local point = opts.point or 'resid_post'
  if type(point) ~= 'string' then error(('%s: point must be a hook point name such as resid_post, got %s'):format(where, type(point)), 2) end
  local cfg = {steps = whole(opts.steps, 'steps', where, 300), lr = number_in(opts.lr, 'lr', where, 0.01, 0, math.huge, true),
    weight_decay = number_in(opts.weight_decay, 'weight_decay', where, 1e-4, 0, math.huge),
    split = number_in(opts.split, 'split', where, 0.8, 0, 1, true), seed = whole(opts.seed, 'seed', where, 0, 0)}
  if opts.control ~= nil and type(opts.control) ~= 'boolean' then
    error(('%s: control must be true or false, got %s'):format(where, tostring(opts.control)), 2)
  end
  local rows = rows_of(model, point, opts.layers, where)
  local ids, _, pad = inputs.to_ids(model, input, opts.tokenizer, where, opts.padding_side)
  if ids.dtype ~= 'int64' then error(('%s: input must be token ids or texts, got %s'):format(where, ids.dtype), 2) end
  pad = inputs.check_mask(ids, pad, where)
  local keep, y, classes = labelled(labels, ids, pad, opts, where)
  cfg.classes = classes
  if opts.control and not classes then error(('%s: control tasks need class labels (int64), not values'):format(where), 2) end
  local B, T = ids:size(1), ids:size(2)
  if B < 2 then error(('%s: the examples are split into train and test: give 2 or more, got %d'):format(where, B), 2) end
  -- the split: whole examples, permuted with the seed (a generator of its own: the session's are left alone)
  local random = lcg(cfg.seed)
  local perm = {}
  for i = 1, B do perm[i] = i end
  for i = B, 2, -1 do
    local j = random(i)
    perm[i], perm[j] = perm[j], perm[i]
  end
  local n_train = math.max(1, math.min(B - 1, math.floor(cfg.split * B + 0.5)))
  local in_train = {}
  for i = 1, n_train do in_train[perm[i]] = true end
  local example_of = ((keep - 1) / T):floor():add(1):long():tolist()  -- each labelled position's example
  local train_list, test_list = {}, {}
  for k, e in ipairs(example_of) do
    if in_train[e] then train_list[#train_list + 1] = k else test_list[#test_list + 1] = k end
  end
  if #train_list == 0 or #test_list == 0 then
    error(('%s: the split leaves %d labelled positions to train and %d to test; give more examples'):format(where, #train_list, #test_list), 2)
  end
  local train_idx = torch.tensor(train_list, {dtype = 'int64', device = ids.device})
  local test_idx = torch.tensor(test_list, {dtype = 'int64', device = ids.device})
  -- classes renumbered 1..K in sorted order
  local K, y_fit, class_values = 1, y, nil
  if classes then
    local seen, values = {}, {}
    for _, v in ipairs(y:tolist()) do if not seen[v] then seen[v] = true; values[#values + 1] = v end end
    table.sort(values)
    local index = {}
    for i, v in ipairs(values) do index[v] = i end
    local renum = {}
    for i, v in ipairs(y:tolist()) do renum[i] = index[v] end
    y_fit, K, class_values = torch.tensor(renum, {dtype = 'int64', device = ids.device}), #values, values
    if K < 2 then error(('%s: the labels hold one class only (%d): nothing to tell apart'):format(where, values[1]), 2) end
  else
    y_fit = y:double()
  end
  -- the control task: each token type's label drawn once from the training labels' distribution
  local y_control
  if opts.control then
    local tokens = ids:reshape(-1):index_select(1, keep):tolist()
    local train_labels = y_fit:index_select(1, train_idx):tolist()
    local by_type, out = {}, {}
    for i, tok in ipairs(tokens) do
      if not by_type[tok] then by_type[tok] = train_labels[random(#train_labels)] end
      out[i] = by_type[tok]
    end
    y_control = torch.tensor(out, {dtype = 'int64', device = ids.device})
  end
  -- the activations, one forward
  local names = {}
  for i, r in ipairs(rows) do names[i] = r.point end
  local _, cache = Cache.run_with_cache(model, ids, {filter = names, attention_mask = pad})
  local train_examples = {}
  for e = 1, B do if in_train[e] then train_examples[#train_examples + 1] = e end end
  local result = setmetatable({point = point, classes = classes, class_values = class_values, control = opts.control == true,
    config = cfg, n_train = train_idx:numel(), n_test = test_idx:numel(), rows = {}, weights = {}, train_examples = train_examples,
    positions = keep, labels = y_fit, control_labels = y_control}, Probes)
  local chance
  if classes then
    local counts, test_labels = {}, y_fit:index_select(1, test_idx):tolist()
    local top = 0
    for _, v in ipairs(test_labels) do counts[v] = (counts[v] or 0) + 1; top = math.max(top, counts[v]) end
    chance = top / #test_labels
  end
  for i, r in ipairs(rows) do
    local act = cache[r.point]
    if not torch.is_tensor(act) or act:size(1) ~= B or act:size(2) ~= T then
      error(('%s: %s is %s, not (B, T, ...) = (%d, %d, ...)'):format(where, r.point, torch.is_tensor(act) and format.shape(act) or type(act), B, T), 2)
    end
    local x = act:reshape(B * T, -1):index_select(1, keep):double()  -- fitted in float64: small, and steady over many steps
    local f = fit(x, y_fit, classes and K or 1, train_idx, test_idx, cfg)
    local row = {layer = r.layer, name = r.name, point = r.point, train_loss = f.train_loss, chance = chance}
    if classes then row.train_acc, row.test_acc = f.train_score, f.test_score
    else row.train_r2, row.test_r2 = f.train_score, f.test_score end
    if y_control then
      local c = fit(x, y_control, K, train_idx, test_idx, cfg)
      row.control_acc, row.control_train_acc, row.control_train_loss = c.test_score, c.train_score, c.train_loss
      row.selectivity = row.test_acc - row.control_acc
    end
    result.rows[i] = row
    result.weights[i] = {weight = f.weight, bias = f.bias, mean = f.mean, std = f.std}
  end
  return result
end

function Probes:__tostring()
  local c = self.config
  local lines = {('linear probes on %s: %s, %d train and %d test positions, %d steps of full-batch Adam (lr %g, weight decay %g), seed %d'):format(
    self.point, self.classes and ('%d classes'):format(#self.class_values) or 'real values', self.n_train, self.n_test, c.steps, c.lr,
    c.weight_decay, c.seed)}
  if self.classes then
    lines[#lines + 1] = ('%-14s %10s %10s %10s%s'):format('layer', 'train loss', 'train acc', 'test acc',
      self.control and ('%12s %12s'):format('control acc', 'selectivity') or '')
    for _, r in ipairs(self.rows) do
      lines[#lines + 1] = ('%-14s %10.4f %10.3f %10.3f%s'):format(r.name, r.train_loss, r.train_acc, r.test_acc,
        self.control and ('%12.3f %12.3f'):format(r.control_acc, r.selectivity) or '')
    end
    lines[#lines + 1] = ('chance (the most frequent class\'s share of the test labels): %.3f'):format(self.rows[1].chance)
  else
    lines[#lines + 1] = ('%-14s %10s %10s %10s'):format('layer', 'train loss', 'train R2', 'test R2')
    for _, r in ipairs(self.rows) do lines[#lines + 1] = ('%-14s %10.4f %10.3f %10.3f'):format(r.name, r.train_loss, r.train_r2, r.test_r2) end
  end
  return table.concat(lines, '\n')
end

-- probes:svg() -> held-out accuracy (R^2 for values) by layer; with a
-- control task its accuracy and the selectivity; chance as a line.
function Probes:svg()
  local xs, names = {}, {}
  for i, r in ipairs(self.rows) do xs[i], names[r.layer] = r.layer, r.name end
  local function col(key) local out = {} for i, r in ipairs(self.rows) do out[i] = r[key] end return out end
  local series, title
  if self.classes then
    title = ('Linear probe accuracy by layer (%s)'):format(self.point)
    series = {{'probe (test)', xs, col('test_acc')}}
    if self.control then
      series[#series + 1] = {'control task (test)', xs, col('control_acc')}
      series[#series + 1] = {'selectivity', xs, col('selectivity')}
    end
    local chance = {}
    for i in ipairs(xs) do chance[i] = self.rows[1].chance end
    series[#series + 1] = {'chance', xs, chance}
  else
    title = ('Linear probe R² by layer (%s)'):format(self.point)
    series = {{'probe (test R²)', xs, col('test_r2')}}
  end
  return charts.lines(title, series, {xlabel = 'layer', ylabel = self.classes and 'accuracy' or 'R²', xnames = names,
    note = ('%d train and %d test positions, whole examples split with seed %d'):format(self.n_train, self.n_test, self.config.seed)})
end

return linear
