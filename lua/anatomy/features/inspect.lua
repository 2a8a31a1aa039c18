-- Looking at features: the contexts where each fires hardest over a corpus,
-- and a page per feature (its activations' histogram, its top contexts,
-- the tokens its decoder direction promotes and suppresses, its density).
-- B batch, T time, F features, K contexts kept per feature, V vocab.
local torch = require('anatomy.torch')
local options = require('anatomy.torch.options')
local hooks = require('anatomy.probe.hooks')
local scope = require('anatomy.probe.scope')
local points = require('anatomy.probe.points')
local charts = require('anatomy.render.charts')
local page = require('anatomy.render.page')
local fs = require('anatomy.io.fs')
local nn = require('anatomy.nn')
local inspect = {}

local esc = charts.esc

-- The features asked for: a list of 1-based indices, one index, or nil (all).
local function feature_list(features, F, where)
  if features == nil then
    local all = {}
    for i = 1, F do all[i] = i end
    return all
  end
  if type(features) == 'number' then features = {features} end
  if type(features) ~= 'table' or #features == 0 then
    error(('%s: features must be a feature index or a list of them, got %s'):format(where, tostring(features)), 3)
  end
  for i, f in ipairs(features) do
    if type(f) ~= 'number' or f % 1 ~= 0 or f < 1 or f > F then
      error(('%s: features[%d] must be a whole number in 1..%d (the SAE has %d features), got %s'):format(where, i, F, F,
        tostring(f)), 3)
    end
  end
  return features
end

-- The point's features over consecutive windows of the split: calls
-- fn(f (B, T, n), ids (B, T), first row) for each batch; f holds the chosen features' activations.
local function scan(model, s, corpus, o, fn)
  local ids = corpus:tokens(o.split)
  local T = o.seq
  local n = math.min(o.batches * o.batch, math.floor(ids:numel() / T))
  if n < 1 then error(('%s: the %s split has %d tokens, fewer than seq = %d'):format(o.where, o.split, ids:numel(), T), 3) end
  local x = ids:narrow(1, 1, n * T):view(n, T)
  local device = model:device()  -- the windows stay on the CPU (for their text); each batch goes to the model
  local index = torch.tensor(o.features, {dtype = 'int64', device = device})
  scope.run(model, function() torch.no_grad(function()
    for first = 1, n, o.batch do
      local b = math.min(o.batch, n - first + 1)
      local xb = x:narrow(1, first, b):to(device)
      local act
      local h = hooks.replace(model, o.point, function(t, _, input) act = s.cfg.transcoder and input or t end)
      model(xb)
      h:remove()
      fn(s:encode(act:float()):index_select(3, index), xb, first)
    end
  end) end, {mode = 'eval'})
  return x
end

-- How many of a feature's nonzero activations the page's histogram holds.
local HISTOGRAM_CAP = 20000

local TopActivations = {}
TopActivations.__index = TopActivations

-- sae.top_activations(model, s, corpus, {features, k = 20, context = 16,
-- after = 4, batches = 32, batch = 16, seq, split = 'val', point, layer}) -> the k
-- contexts where each feature fires hardest, over consecutive windows of
-- the split: r[feature] = {{value, row, position, before, token, after}, ...}
-- (before: up to `context` tokens before the activating one, after: `after`
-- tokens following it, as text). Prints with the token marked «so»; r.counts[feature]: tokens it fired on, r.tokens: tokens scanned.
-- s may be a sae.CLT with layer = l: that layer's features, at the point its encoder reads.
function inspect.top_activations(model, s, corpus, opts)
  local where = 'sae.top_activations'
  opts = options.check(opts, {'features', 'k', 'context', 'after', 'batches', 'batch', 'seq', 'split', 'point', 'layer'}, where, 2)
  if nn.typename(s) == 'sae.CLT' then  -- one layer's encoder, read as an SAE's (features/clt_eval.lua)
    s = require('anatomy.features.clt_eval').layer(model, s, opts.layer, where, 3)
  elseif opts.layer ~= nil then
    error(('%s: layer is for a sae.CLT (which layer\'s features); an SAE has one point'):format(where), 2)
  end
  local o = {where = where, split = opts.split or 'val'}
  if o.split ~= 'val' and o.split ~= 'train' then error(("%s: split must be 'train' or 'val', got %s"):format(where, tostring(o.split)), 2) end
  o.features = feature_list(opts.features, s.cfg.d_sae, where)
  o.k = options.whole(opts.k, 'k', where, 20)
  o.context = options.whole(opts.context, 'context', where, 16, 0)
  o.after = options.whole(opts.after, 'after', where, 4, 0)
  o.batches = options.whole(opts.batches, 'batches', where, 32)
  o.batch = options.whole(opts.batch, 'batch', where, 16)
  o.seq = options.whole(opts.seq, 'seq', where, s.cfg.trained and s.cfg.trained.seq or math.min(model:context() or 128, 128))
  local point = opts.point or s.cfg.point
  local canonical, why = points.canonical(model, point or '')
  if not canonical then error(('%s: point: %s'):format(where, why), 2) end
  o.point = canonical
  local nf = #o.features
  local best_v, best_i  -- (K', nf): the largest values so far and their global row·T + t
  local counts = torch.zeros(nf, {dtype = 'float64', device = model:device()})
  local values = {}  -- every nonzero activation's value per feature, for the histograms (capped)
  local x = scan(model, s, corpus, o, function(f, _, first)
    local B, T = f:size(1), f:size(2)
    local flat = f:reshape({B * T, nf})
    counts = counts + flat:gt(0):double():sum(1)
    local k = math.min(o.k, B * T)
    local v, i = flat:topk(k, 1)  -- (k, nf)
    i = i + (first - 1) * T  -- 1-based row in the scan, counted in tokens
    if best_v then
      v, i = torch.cat({best_v, v}, 1), torch.cat({best_i, i}, 1)
      local keep
      v, keep = v:topk(math.min(o.k, v:size(1)), 1)
      i = i:gather(1, keep)
    end
    best_v, best_i = v, i
    for j = 1, nf do  -- the first HISTOGRAM_CAP nonzero activations in scan order, exactly
      local list = values[j] or {}
      values[j] = list
      if #list < HISTOGRAM_CAP then
        for _, a in ipairs(flat:select(2, j):masked_select(flat:select(2, j):gt(0)):tolist()) do
          if #list >= HISTOGRAM_CAP then break end
          list[#list + 1] = a
        end
      end
    end
  end)
  local T = o.seq
  local r = setmetatable({features = o.features, counts = {}, tokens = x:numel(), point = o.point, values = values, k = o.k,
    _model = model, _sae = s, _tokenizer = corpus}, TopActivations)
  local decode = function(ids) return corpus:decode(ids) end
  local flat_ids = x:reshape(-1)
  local vlist, ilist = best_v:tolist(), best_i:tolist()
  for j, feature in ipairs(o.features) do
    local list = {}
    for row = 1, #vlist do
      local value = vlist[row][j]
      if value > 0 then
        local g = ilist[row][j]
        local seqi, pos = math.floor((g - 1) / T) + 1, (g - 1) % T + 1
        local ids = x[seqi]
        local from = math.max(1, pos - o.context)
        local to = math.min(T, pos + o.after)
        -- the windows are consecutive stretches of the split: what came before this one, which the model did not see
        local earlier = math.min(pos - 1 < o.context and o.context - (pos - 1) or 0, (seqi - 1) * T)
        list[#list + 1] = {value = value, row = seqi, position = pos,
          before_window = earlier > 0 and decode(flat_ids:narrow(1, (seqi - 1) * T - earlier + 1, earlier)) or '',
          before = pos > from and decode(ids:narrow(1, from, pos - from)) or '',
          token = decode(ids:narrow(1, pos, 1)),
          after = to > pos and decode(ids:narrow(1, pos + 1, to - pos)) or ''}
      end
    end
    r[feature] = list
    r.counts[feature] = counts[j]:item()
  end
  return r
end

local function one_line(s) return (s:gsub('\n', '\\n')) end

-- Text on one line for a table cell: a newline as ↵; with token = true also
-- a space as ␣ (a marked token that is blank would not show).
local function visible(s, token)
  s = s:gsub('\n', '↵')
  if token then s = s:gsub(' ', '␣') end
  return s
end

function TopActivations:__tostring()
  local lines = {('top activations at %s over %d tokens (¦: the start of the window the model read)'):format(self.point, self.tokens)}
  for _, feature in ipairs(self.features) do
    local list = self[feature]
    lines[#lines + 1] = ('feature %d: fires on %d tokens (%.3f%%)'):format(feature, self.counts[feature],
      100 * self.counts[feature] / self.tokens)
    for i = 1, math.min(#list, 5) do
      local c = list[i]
      lines[#lines + 1] = ('  %8.3f  %s%s«%s»%s'):format(c.value, c.before_window ~= '' and (one_line(c.before_window) .. '¦') or '',
        one_line(c.before), one_line(c.token), one_line(c.after))
    end
    if #list == 0 then lines[#lines + 1] = '  (never fires on these tokens)' end
  end
  return table.concat(lines, '\n')
end

-- The decoder direction of a feature through the model's head:
-- model:readout(d) − model:readout(0) (the final norm and the unembedding;
-- the difference leaves out what the norm's bias adds to every token).
local function logit_effect(model, s, feature)
  if type(model.readout) ~= 'function' then return nil end
  return torch.no_grad(function()
    local d = s.W_dec[feature]:detach():view(1, 1, -1)
    return (model:readout(d) - model:readout(torch.zeros_like(d))):view(-1)
  end)
end

-- r:page(feature) -> HTML of one feature: its density, the histogram of its
-- nonzero activations, its top contexts with the token marked, and the 10
-- tokens its decoder direction promotes most and least through the model's
-- head (model:readout). r:save(feature, path) writes it; r:feature(feature)
-- is a value that a notebook shows inline.
function TopActivations:page(feature)
  local model, s, tokenizer = self._model, self._sae, self._tokenizer
  local list = self[feature]
  if not list then error(('r:page: feature %s was not among those scanned (%d of them)'):format(tostring(feature), #self.features), 2) end
  local parts = {}
  local density = self.counts[feature] / self.tokens
  parts[#parts + 1] = ('<p>At %s: fires on %d of %d tokens (density %.3g); %s.</p>'):format(esc(self.point),
    self.counts[feature], self.tokens, density, s.cfg.description or (s.cfg.kind .. ' SAE, ' .. s.cfg.d_sae .. ' features'))
  local vals = self.values[self:index(feature)] or {}
  if #vals > 0 then
    local lo, hi = math.huge, -math.huge
    for _, v in ipairs(vals) do lo, hi = math.min(lo, v), math.max(hi, v) end
    local nb = 20
    local width = (hi - lo) / nb
    local bins, labels = {}, {}
    for b = 1, nb do bins[b] = 0 end
    for _, v in ipairs(vals) do
      local b = width > 0 and math.min(nb, math.floor((v - lo) / width) + 1) or 1
      bins[b] = bins[b] + 1
    end
    for b = 1, nb do labels[b] = ('%.3g'):format(lo + (b - 0.5) * width) end
    local all = self.counts[feature]
    parts[#parts + 1] = charts.bars(('Feature %d: its nonzero activations'):format(feature), labels, bins,
      {xlabel = 'activation (bin centre)', ylabel = 'tokens', note = #vals < all
        and ('the first %d of its %d nonzero activations, in scan order'):format(#vals, all)
        or ('all %d of its nonzero activations'):format(#vals)})
  end
  local rows = {}
  for i, c in ipairs(list) do
    rows[i] = ('<tr><td>%.3f</td><td style="font-family:monospace;white-space:pre;text-align:left"><span style="color:#999" '
      .. 'title="before the window the model read">%s</span>%s<mark>%s</mark>%s</td></tr>'):format(
      c.value, esc(visible(c.before_window or '')), esc(visible(c.before)), esc(visible(c.token, true)), esc(visible(c.after)))
  end
  parts[#parts + 1] = ('<h2>Top %d contexts</h2><table><tr><th>activation</th><th>context (the token marked; grey: before the window the model read)</th></tr>%s</table>'):format(
    #list, table.concat(rows))
  local effect = logit_effect(model, s, feature)
  if effect and tokenizer then
    local function tokens(largest)
      local v, i = effect:topk(math.min(10, effect:numel()), 1, {largest = largest})
      local out = {}
      for j, id in ipairs(i:tolist()) do
        out[j] = ('<tr><td style="font-family:monospace;text-align:left">%s</td><td>%+.3f</td></tr>'):format(
          esc(visible(tokenizer:decode({id}), true)), v[j]:item())
      end
      return table.concat(out)
    end
    parts[#parts + 1] = ('<h2>What its direction does to the logits</h2><p>The decoder row through the model\'s head ' ..
      '(model:readout(d) − model:readout(0)).</p><table><tr><th>promotes</th><th>logit</th></tr>%s</table>' ..
      '<table><tr><th>suppresses</th><th>logit</th></tr>%s</table>'):format(tokens(true), tokens(false))
  end
  return page.new(('Feature %d'):format(feature), table.concat(parts, '\n'))
end

-- r:index(feature) -> its position among the scanned features
function TopActivations:index(feature)
  for j, f in ipairs(self.features) do if f == feature then return j end end
  return nil
end

-- r:save(feature, path) -> path: the feature page as an HTML file (written atomically)
function TopActivations:save(feature, path)
  if type(path) ~= 'string' then error(('r:save: path must be a string, got %s'):format(type(path)), 2) end
  fs.write_atomic(path, self:page(feature))
  return path
end

local FeaturePage = {}
FeaturePage.__index = FeaturePage
function FeaturePage:__tostring() return self.text end
function FeaturePage:_repr_mimebundle()
  return {['text/html'] = page.embed(self.html), ['text/plain'] = self.text}
end

-- r:feature(feature) -> the feature page as a value: its top contexts when
-- printed, the whole page inline in a notebook
function TopActivations:feature(feature)
  local html = self:page(feature)
  local sub = setmetatable({features = {feature}, counts = self.counts, tokens = self.tokens, point = self.point, [feature] = self[feature]},
    TopActivations)
  return setmetatable({html = html, text = tostring(sub)}, FeaturePage)
end

return inspect
