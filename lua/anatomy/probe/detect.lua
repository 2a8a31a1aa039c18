-- probe.detect_heads: which heads attend where a known kind of head does.
-- For every head of every layer, the attention its queries put on the keys
-- a pattern names, averaged over the queries that have such a key:
--   previous_token   the key just before the query (p - 1)
--   duplicate_token  the earlier positions holding the query's own token
--   induction        the positions just after an earlier occurrence of the
--                    query's token (the token that followed it then), not
--                    the query itself
-- The scores are attention weights (0..1): TransformerLens's head detector
-- with its 'mul' measure, over the queries the pattern applies to.
local inputs = require('anatomy.probe.inputs')
local Cache = require('anatomy.probe.cache')
local options = require('anatomy.torch.options')
local charts = require('anatomy.render.charts')

local detect = {}
local Scores = {}
Scores.__index = Scores
Scores.__typename = 'probe.HeadScores'
detect.HeadScores = Scores

detect.kinds = {'previous_token', 'duplicate_token', 'induction'}

-- The keys each query looks for: (B, T, T) float, [b][q][k] = 1 where key k
-- is one the kind names for query q.
local function targets(ids, kind)
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
  -- induction: key k = j + 1 for an earlier occurrence j of the query's token, k < q
  local after = torch.zeros(B, T, T, {dtype = 'bool', device = ids.device})
  after:narrow(3, 2, T - 1):copy_(same:narrow(3, 1, T - 1))
  return after:logical_and(k:lt(q):unsqueeze(1)):double()
end

-- probe.detect_heads(model, input, kind, {tokenizer, padding_side}) ->
-- scores: kind is 'previous_token', 'duplicate_token' or 'induction'
-- (or a list of them: a table of scores by kind). scores.scores[l][h] is
-- head h of layer l's mean attention on the keys the kind names, over the
-- queries that have one (padding excluded); scores.queries counts them.
-- print(scores) shows the grid; scores:top(k) the k highest heads;
-- scores:heads(threshold) those above it; scores:svg() the heatmap.
function detect.heads(model, input, kind, opts)
  local where = 'probe.detect_heads'
  opts = options.check(opts, {'tokenizer', 'padding_side'}, where, 2)
  local kinds = type(kind) == 'table' and kind or {kind}
  for _, k in ipairs(kinds) do
    local known = false
    for _, name in ipairs(detect.kinds) do known = known or name == k end
    if not known then
      error(("%s: kind must be one of %s, got %s"):format(where, table.concat(detect.kinds, ', '), tostring(k)), 2)
    end
  end
  local layers, why = model:layers()
  if not layers then error(('%s: %s'):format(where, why), 2) end
  local ok, ids, _, mask = pcall(inputs.to_ids, model, input, opts.tokenizer, where, opts.padding_side)
  if not ok then error((tostring(ids):gsub('^[^\n]-:%d+: ', '')), 2) end
  if ids.dtype ~= 'int64' then error(('%s: input must be token ids or texts, got %s'):format(where, ids.dtype), 2) end
  mask = inputs.check_mask(ids, mask, where)
  local _, cache = Cache.run_with_cache(model, ids, {filter = '*.pattern', attention_mask = mask})
  if type(kind) == 'table' then  -- one forward for every kind
    local out = {}
    for _, k in ipairs(kind) do out[k] = detect.score(cache, layers, ids, mask, k, where, 2) end
    return out
  end
  return detect.score(cache, layers, ids, mask, kind, where, 2)
end

-- detect.score(cache, layers, ids, mask, kind, where, level) -> scores: one
-- kind's scores from a cache of every layer's pattern (errors at `level`
-- above the caller).
function detect.score(cache, layers, ids, mask, kind, where, level)
  level = (level or 1) + 1
  local want = targets(ids, kind)
  if mask then  -- padded queries and keys out
    local m = mask:double()
    want = want * m:unsqueeze(3) * m:unsqueeze(2)
  end
  local has = want:sum(3):gt(0):double()  -- (B, T): queries with a target
  local n = has:sum():item()
  if n == 0 then
    error(('%s: no query in the input has a key the %s pattern names (the input is too short, or no token repeats)'):format(where, kind), level)
  end
  local self = setmetatable({kind = kind, scores = {}, layers = {}, queries = n}, Scores)
  for l, layer in ipairs(layers) do
    local ok, p = pcall(cache.heads, cache, 'pattern', l)  -- (H, B, T, T)
    if not ok then error(('%s: layer %s publishes no attention pattern (%s)'):format(where, layer[1], tostring(p):match('[^\n]*')), level) end
    local on = (p:double() * want:unsqueeze(1)):sum(4)        -- (H, B, T): attention on the targets
    self.scores[l] = ((on * has:unsqueeze(1)):sum(3):sum(2) / n):tolist()
    self.layers[l] = layer[1]
  end
  return self
end

-- scores:top(k = 3) -> {{layer, head, name, score}, ...}, highest first
function Scores:top(k)
  k = k or 3
  if type(k) ~= 'number' or k % 1 ~= 0 or k < 1 then error(('scores:top: k must be a positive whole number, got %s'):format(tostring(k)), 2) end
  local all = {}
  for l, row in ipairs(self.scores) do
    for h, v in ipairs(row) do all[#all + 1] = {layer = l, head = h, name = ('%s head %d'):format(self.layers[l], h), score = v} end
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
      if v > threshold then out[#out + 1] = {layer = l, head = h, name = ('%s head %d'):format(self.layers[l], h), score = v} end
    end
  end
  return out
end

function Scores:__tostring()
  local what = ({previous_token = 'the previous token', duplicate_token = 'earlier copies of its own token',
    induction = 'the token after an earlier copy of its own'})[self.kind]
  local lines = {('%s scores: each head\'s mean attention on %s, over %d queries'):format(self.kind, what, self.queries)}
  local H = #(self.scores[1] or {})
  local head = {('%-14s'):format('layer')}
  for h = 1, H do head[#head + 1] = ('%8s'):format('head ' .. h) end
  lines[#lines + 1] = table.concat(head, ' ')
  for l, row in ipairs(self.scores) do
    local cells = {('%-14s'):format(self.layers[l])}
    for h = 1, H do cells[#cells + 1] = ('%8.3f'):format(row[h]) end
    lines[#lines + 1] = table.concat(cells, ' ')
  end
  return table.concat(lines, '\n')
end

-- scores:svg() -> a layers x heads heatmap of the scores
function Scores:svg()
  local cols = {}
  for h = 1, #(self.scores[1] or {}) do cols[h] = 'head ' .. h end
  return charts.heatmap(('%s scores per head'):format(self.kind), self.layers, cols, self.scores, false,
    {xlabel = 'head', ylabel = 'layer', value = 'attention', note = ('over %d queries'):format(self.queries)})
end

return detect
