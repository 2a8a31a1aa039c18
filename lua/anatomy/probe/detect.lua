-- probe.detect_heads: which heads attend where a known kind of head does.
-- For every head of every layer, the attention its queries put on the keys
-- a pattern names (TransformerLens's detection patterns):
--   previous_token   the key just before the query (p - 1)
--   duplicate_token  the earlier positions holding the query's own token
--   induction        the positions just after an earlier occurrence of the
--                    query's token (the token that followed it then); the
--                    query itself when the token before it is its own
-- measure = 'mul' (the default) is TransformerLens's detect_head with its
-- 'mul' measure: in each sequence, the attention on those keys over all the
-- attention (every query's, whether it has a target or not), then the mean
-- over sequences. measure = 'targeted' is the mean attention on the keys
-- over the queries that have one, pooled over the batch (induction's keys
-- strictly before the query): it reads a head's behaviour where it can
-- show it, and is not TransformerLens's number.
local torch = require('anatomy.torch')
local inputs = require('anatomy.probe.inputs')
local Cache = require('anatomy.probe.cache')
local hooks = require('anatomy.probe.hooks')
local options = require('anatomy.torch.options')
local charts = require('anatomy.render.charts')

local detect = {}
local Scores = {}
Scores.__index = Scores
Scores.__typename = 'probe.HeadScores'
detect.HeadScores = Scores

detect.kinds = {'previous_token', 'duplicate_token', 'induction'}
detect.measures = {'mul', 'targeted'}

-- The keys each query looks for: (B, T, T) float, [b][q][k] = 1 where key k
-- is one the kind names for query q. induction_self: an induction key may be
-- the query itself (TransformerLens's pattern).
local function targets(ids, kind, induction_self)
  local B, T = ids:size(1), ids:size(2)
  local q = torch.arange(1, T + 1, {device = ids.device}):reshape(T, 1)
  local k = torch.arange(1, T + 1, {device = ids.device}):reshape(1, T)
  if kind == 'previous_token' then
    return k:eq(q - 1):unsqueeze(1):expand(B, T, T):double()
  end
  local same = ids:unsqueeze(3):eq(ids:unsqueeze(2))  -- [b][q][j]: token j is token q
  if kind == 'duplicate_token' then
    return same:logical_and(k:lt(q):unsqueeze(1)):double()
  end
  -- induction: key k = j + 1 for an earlier occurrence j of the query's token
  local after = torch.zeros(B, T, T, {dtype = 'bool', device = ids.device})
  after:narrow(3, 2, T - 1):copy_(same:narrow(3, 1, T - 1))
  local allowed = induction_self and k:le(q) or k:lt(q)
  return after:logical_and(allowed:unsqueeze(1)):double()
end

-- ids with each sequence's real tokens shuffled, the first kept in its
-- place (a BOS stays a BOS): a fixed permutation from `seed` (Park-Miller),
-- so that the baseline is the same every run and draws nothing from
-- torch's generator.
local function shuffled(ids, mask, seed)
  local rows = ids:tolist()
  local real = mask and mask:tolist() or nil
  local state = (seed % 2147483646) + 1
  local function draw(n)
    state = (state * 16807) % 2147483647
    return state % n + 1
  end
  for b, row in ipairs(rows) do
    local positions = {}
    for t = 1, #row do
      if not real or real[b][t] then positions[#positions + 1] = t end
    end
    for i = #positions, 3, -1 do  -- positions[1] stays
      local j = draw(i - 1) + 1
      row[positions[i]], row[positions[j]] = row[positions[j]], row[positions[i]]
    end
  end
  return torch.tensor(rows, {dtype = 'int64', device = ids.device})
end

-- probe.detect_heads(model, input, kind, {measure = 'mul', exclude_bos =
-- false, exclude_current_token = false, baseline = true, seed = 0,
-- tokenizer, padding_side}) -> scores: kind is 'previous_token',
-- 'duplicate_token' or 'induction' (or a list of them: a table of scores by
-- kind). scores.scores[l][h] is head h of layer l's score by `measure`
-- (above); exclude_bos and exclude_current_token leave out the attention on
-- each sequence's first real position and on the query itself, as
-- TransformerLens's options do (for 'mul': from the denominator too).
-- scores.shuffled[l][h] is the same head's score when the model reads the
-- input with its tokens shuffled (the first kept) against the targets of the
-- input as given: a head that finds its keys by content drops there, one
-- that attends by position does not (for previous_token, a positional kind,
-- the two agree). scores.uniform is the score of a head that attends evenly
-- to every key it may see. scores.queries counts the queries with a target.
-- print(scores) shows the grid; scores:top(k) the k highest heads;
-- scores:heads(threshold) those above it; scores:svg() the heatmap.
function detect.heads(model, input, kind, opts)
  local where = 'probe.detect_heads'
  hooks.require_clean(model, where, 2)
  opts = options.check(opts, {'tokenizer', 'padding_side', 'measure', 'exclude_bos', 'exclude_current_token', 'baseline',
    'seed'}, where, 2)
  local kinds = type(kind) == 'table' and kind or {kind}
  for _, k in ipairs(kinds) do
    local known = false
    for _, name in ipairs(detect.kinds) do known = known or name == k end
    if not known then
      error(("%s: kind must be one of %s, got %s"):format(where, table.concat(detect.kinds, ', '), tostring(k)), 2)
    end
  end
  local measure = opts.measure or 'mul'
  if measure ~= 'mul' and measure ~= 'targeted' then
    error(("%s: measure must be 'mul' (TransformerLens's) or 'targeted', got %s"):format(where, tostring(measure)), 2)
  end
  for _, flag in ipairs{'exclude_bos', 'exclude_current_token', 'baseline'} do
    if opts[flag] ~= nil and type(opts[flag]) ~= 'boolean' then
      error(('%s: %s must be true or false, got %s'):format(where, flag, tostring(opts[flag])), 2)
    end
  end
  local seed = options.whole(opts.seed, 'seed', where, 0, 0)
  local layers, why = model:layers()
  if not layers then error(('%s: %s'):format(where, why), 2) end
  local ok, ids, _, mask = pcall(inputs.to_ids, model, input, opts.tokenizer, where, opts.padding_side)
  if not ok then error((tostring(ids):gsub('^[^\n]-:%d+: ', '')), 2) end
  if ids.dtype ~= 'int64' then error(('%s: input must be token ids or texts, got %s'):format(where, ids.dtype), 2) end
  mask = inputs.check_mask(ids, mask, where)
  local settings = {measure = measure, exclude_bos = opts.exclude_bos == true,
    exclude_current_token = opts.exclude_current_token == true}
  local _, cache = Cache.run_with_cache(model, ids, {filter = '*.pattern', attention_mask = mask})
  local shuffled_cache
  if opts.baseline ~= false then
    _, shuffled_cache = Cache.run_with_cache(model, shuffled(ids, mask, seed), {filter = '*.pattern', attention_mask = mask})
  end
  local out = {}
  for _, k in ipairs(kinds) do
    out[k] = detect.score(cache, layers, ids, mask, k, where, 2, settings)
    if shuffled_cache then
      out[k].shuffled = detect.score(shuffled_cache, layers, ids, mask, k, where, 2, settings).scores
    end
  end
  if type(kind) == 'table' then return out end  -- one forward (two with the baseline) for every kind
  return out[kind]
end

-- The first real position of each sequence: (B, T) bool, true there.
local function first_real(ids, mask)
  local B, T = ids:size(1), ids:size(2)
  local first = torch.zeros(B, T, {dtype = 'bool', device = ids.device})
  for b = 1, B do
    local t = 1
    if mask then
      local row = mask[b]:tolist()
      while t <= T and not row[t] do t = t + 1 end
    end
    if t <= T then first[b][t] = true end
  end
  return first
end

-- detect.score(cache, layers, ids, mask, kind, where, level, settings) ->
-- scores: one kind's scores from a cache of every layer's pattern (errors
-- at `level` above the caller); settings: {measure, exclude_bos,
-- exclude_current_token} as probe.detect_heads takes them.
function detect.score(cache, layers, ids, mask, kind, where, level, settings)
  level = (level or 1) + 1
  settings = settings or {measure = 'mul'}
  local mul = settings.measure ~= 'targeted'
  local B, T = ids:size(1), ids:size(2)
  local want = targets(ids, kind, mul)
  local real = mask and mask:double() or torch.ones(B, T, {dtype = 'float64', device = ids.device})
  want = want * real:unsqueeze(3) * real:unsqueeze(2)  -- padded queries and keys out
  -- the attention that counts: real queries on real keys, less what is excluded
  local keep = real:unsqueeze(3) * real:unsqueeze(2)    -- (B, T, T)
  if settings.exclude_bos then keep = keep * first_real(ids, mask):logical_not():double():unsqueeze(2) end
  if settings.exclude_current_token then
    keep = keep * torch.eye(T, {dtype = 'float64', device = ids.device}):logical_not():double():unsqueeze(1)
  end
  want = want * keep
  local has = want:sum(3):gt(0):double()  -- (B, T): queries with a target
  local n = has:sum():item()
  if n == 0 then
    error(('%s: no query in the input has a key the %s pattern names (the input is too short, or no token repeats)'):format(where, kind), level)
  end
  local self = setmetatable({kind = kind, measure = settings.measure or 'mul', scores = {}, layers = {}, queries = n,
    sequences = B}, Scores)
  -- a head attending evenly to every key it may see (causal, real), with the same exclusions
  local causal = torch.ones(T, T, {dtype = 'float64', device = ids.device}):tril():unsqueeze(1) * real:unsqueeze(3) * real:unsqueeze(2)
  local even = causal / causal:sum(3, true):clamp_min(1)
  local function reduce(p)  -- p (H, B, T, T) float64 -> {score per head}
    local on = (p * want:unsqueeze(1)):sum(4)  -- (H, B, T): attention on the targets
    if mul then
      local total = (p * keep:unsqueeze(1)):sum(4):sum(3)   -- (H, B): the attention that counts, each sequence
      return (on:sum(3) / total):mean(2):tolist()
    end
    return ((on * has:unsqueeze(1)):sum(3):sum(2) / n):tolist()
  end
  self.uniform = reduce(even:unsqueeze(1))[1]
  for l, layer in ipairs(layers) do
    local ok, p = pcall(cache.heads, cache, 'pattern', l)  -- (H, B, T, T)
    if not ok then error(('%s: layer %s publishes no attention pattern (%s)'):format(where, layer[1], tostring(p):match('[^\n]*')), level) end
    self.scores[l] = reduce(p:double())
    self.layers[l] = layer[1]
  end
  return self
end

-- scores:top(k = 3) -> {{layer, head, name, score, shuffled}, ...}, highest first
function Scores:top(k)
  k = k or 3
  if type(k) ~= 'number' or k % 1 ~= 0 or k < 1 then error(('scores:top: k must be a positive whole number, got %s'):format(tostring(k)), 2) end
  local all = {}
  for l, row in ipairs(self.scores) do
    for h, v in ipairs(row) do
      all[#all + 1] = {layer = l, head = h, name = ('%s head %d'):format(self.layers[l], h), score = v,
        shuffled = self.shuffled and self.shuffled[l][h]}
    end
  end
  table.sort(all, function(a, b) return a.score > b.score end)
  local out = {}
  for i = 1, math.min(k, #all) do out[i] = all[i] end
  return out
end

-- scores:heads(threshold) -> the heads scoring above it, in layer and head order
function Scores:heads(threshold)
  if type(threshold) ~= 'number' or threshold ~= threshold then
    error(('scores:heads: threshold must be a number, got %s'):format(tostring(threshold)), 2)
  end
  local out = {}
  for l, row in ipairs(self.scores) do
    for h, v in ipairs(row) do
      if v > threshold then
        out[#out + 1] = {layer = l, head = h, name = ('%s head %d'):format(self.layers[l], h), score = v,
          shuffled = self.shuffled and self.shuffled[l][h]}
      end
    end
  end
  return out
end

function Scores:__tostring()
  local what = ({previous_token = 'the previous token', duplicate_token = 'earlier copies of its own token',
    induction = 'the token after an earlier copy of its own'})[self.kind]
  local how = self.measure == 'targeted' and ('mean over the %d queries that have one'):format(self.queries)
    or ("TransformerLens's 'mul': share of all attention, mean over %d sequence%s"):format(self.sequences, self.sequences == 1 and '' or 's')
  local lines = {('%s scores: each head\'s attention on %s (%s)'):format(self.kind, what, how)}
  if self.shuffled then
    lines[#lines + 1] = '  each cell: score (the same head on the tokens shuffled, against these targets)'
  end
  lines[#lines + 1] = ('  a head attending evenly to every key it may see scores %.3f'):format(self.uniform)
  local H = #(self.scores[1] or {})
  local w = self.shuffled and 15 or 8
  local head = {('%-14s'):format('layer')}
  for h = 1, H do head[#head + 1] = ('%' .. w .. 's'):format('head ' .. h) end
  lines[#lines + 1] = table.concat(head, ' ')
  for l, row in ipairs(self.scores) do
    local cells = {('%-14s'):format(self.layers[l])}
    for h = 1, H do
      local cell = ('%.3f'):format(row[h])
      if self.shuffled then cell = ('%s (%.3f)'):format(cell, self.shuffled[l][h]) end
      cells[#cells + 1] = ('%' .. w .. 's'):format(cell)
    end
    lines[#lines + 1] = table.concat(cells, ' ')
  end
  return table.concat(lines, '\n')
end

-- scores:svg() -> a layers x heads heatmap of the scores
function Scores:svg()
  local cols = {}
  for h = 1, #(self.scores[1] or {}) do cols[h] = 'head ' .. h end
  return charts.heatmap(('%s scores per head'):format(self.kind), self.layers, cols, self.scores, false,
    {xlabel = 'head', ylabel = 'layer', value = 'attention', note = self.measure == 'targeted' and ('over %d queries'):format(self.queries)
      or ("TransformerLens's mul, over %d sequences; even attention scores %.3f"):format(self.sequences, self.uniform)})
end

hooks.analysis(detect.heads)

return detect
