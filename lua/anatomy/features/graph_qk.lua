-- g:qk(layer, head, {query_pos, key_pos, top_k}): QK attributions for one of
-- the attention patterns an attribution graph freezes (circuit-tracer's
-- issue #53): which of the graph's sources at the query and key positions
-- make a head's pre-softmax score. In the graph's replacement model (every
-- attention pattern and norm divisor frozen at the clean run, the
-- transcoders' nodes writing into the MLP outputs) the stream is linear in
-- the sources (active features, error nodes, token embeddings) plus a
-- constant part (biases, position embeddings, the norms' biases, b_dec, the
-- first position's MLP outputs); so are the query at q and the key at k
-- after their projections (a qk_norm's divisor frozen too, and rotary):
--   query = Σ_s a_s + a_0,  key = Σ_t b_t + b_0,
--   score = scale · (Σ_{s,t} a_s·b_t + a_0·Σ_t b_t + Σ_s a_s·b_0 + a_0·b_0)
-- with scale the head's (1/sqrt(d_head) or the model's). a_s comes as
-- sae.attribute's rows do: a backward pass through the frozen model from
-- the d_head components of the query (a batch of d_head targets), times
-- each source's write; likewise b_t. a_0 and b_0 come from a run of the
-- frozen model with every source taken out. Nodes are named
-- 'L3 F120 @5', 'error L2 @4', "token 'x' @1", 'bias'. Errors are raised
-- at the level of g:qk's caller (Graph.lua delegates here).
-- S sources (n features, L·T errors, T tokens), D d_head.
local torch = require('anatomy.torch')
local options = require('anatomy.torch.options')
local points = require('anatomy.probe.points')
local hooks = require('anatomy.probe.hooks')
local probe = require('anatomy.probe')
local nn = require('anatomy.nn')
local graph = require('anatomy.features.graph')

local M = {}
local WHERE = 'g:qk'

local function whole(v, name, lo, hi, what)
  if type(v) ~= 'number' or v ~= v or v ~= math.floor(v) or v < lo or v > hi then
    error(('%s: %s must be a whole number in %d..%d (%s), got %s'):format(WHERE, name, lo, hi, what, tostring(v)), 4)
  end
  return v
end

-- The layer's attention: its points, heads and the scores' scale; a head
-- whose score is not bilinear in the stream is refused
local function attention(model, layer)
  local name = points.part(model, layer, 'attn', 4)
  local m = points.module(model, name)
  local kind = nn.typename(m)
  if kind ~= 'nn.Attention' and kind ~= 'nn.RoPEAttention' then
    error(('%s: layer %d\'s attention is a %s; QK attributions read nn.Attention or nn.RoPEAttention'):format(
      WHERE, layer, tostring(kind)), 4)
  end
  local made = rawget(m, '_made_with') or {}
  if (made.softcap or 0) ~= 0 then
    error(('%s: layer %d\'s attention soft-caps its scores (softcap %s); they are not bilinear in the stream'):format(
      WHERE, layer, tostring(made.softcap)), 4)
  end
  local H = made.heads
  local D = made.head_dim or made.dim / H
  local rope = kind == 'nn.RoPEAttention'
  local att = {name = name, q = name .. (rope and '.rot_q' or '.q'), k = name .. (rope and '.rot_k' or '.k'),
    H = H, KV = made.kv_heads or H, D = D, window = made.sliding_window or 0,
    scale = (made.scale or 0) > 0 and made.scale or 1 / math.sqrt(D)}
  if made.qk_norm and made.qk_norm ~= 'none' then  -- its divisor frozen as the other norms' are
    local w = {}
    for n, p in m:named_parameters() do
      if n == 'q_norm.weight' or n == 'k_norm.weight' then w[n:sub(1, 1)] = p:detach() + (made.qk_norm_offset or 0) end
    end
    att.norm = {over_heads = made.qk_norm ~= 'head', eps = made.qk_norm_eps or 1e-6, w = w}
  end
  return att
end

-- Under qk_norm, the clean run's factor (T, heads, D) from the query (key)
-- before the norm to after it: the norm's weight over its divisor
local function norm_factor(att, pre, p)
  local dims = att.norm.over_heads and {-2, -1} or {-1}
  local ms = pre:pow(2)
  for _, d in ipairs(dims) do ms = ms:mean(d, true) end
  local w = att.norm.w[p]:to(pre.device, pre.dtype)
  w = att.norm.over_heads and w:view(1, pre:size(2), pre:size(3)) or w:view(1, 1, pre:size(3))
  return w / (ms + att.norm.eps):sqrt()  -- (T, heads, D)
end

-- hooks that normalise the queries and keys with their clean divisors
-- (rec.factor), appended to hs; nothing without qk_norm
local function freeze_norm(model, att, rec, hs)
  if not att.norm then return end
  for _, p in ipairs{'q', 'k'} do
    local pre = {}
    hs[#hs + 1] = hooks.replace(model, att.name .. '.' .. p, function(t) pre.t = t end)
    hs[#hs + 1] = hooks.replace(model, att.name .. '.' .. p .. '_normed', function(t)
      return pre.t * rec.factor[p]:to(t.device, t.dtype):unsqueeze(1)
    end)
  end
end

local function run(model, ids, hs)
  probe.scope(model, function()
    torch.no_grad(function() hooks.with(hooks.group(hs), function() model(ids:view(1, -1)) end) end)
  end, {mode = 'eval'})
end

-- The clean run's values at the frozen points, and the layer's queries,
-- keys (T, H, D), scores and pattern (H, T, T)
local function record(model, frozen, att, ids)
  local rec, hs = {}, {}
  for _, name in ipairs(frozen) do
    hs[#hs + 1] = hooks.replace(model, name, function(t) rec[name] = t:detach():clone() end)
  end
  for _, p in ipairs{'q', 'k', 'scores'} do
    local at = p == 'scores' and att.name .. '.scores' or att[p]
    hs[#hs + 1] = hooks.replace(model, at, function(t) rec[p] = t[1]:detach():float():cpu() end)
  end
  local pre = {}
  if att.norm then
    for _, p in ipairs{'q', 'k'} do
      hs[#hs + 1] = hooks.replace(model, att.name .. '.' .. p, function(t) pre[p] = t[1]:detach():clone() end)
    end
  end
  run(model, ids, hs)
  rec.pattern = rec[att.name .. '.pattern'][1]:float():cpu()
  if att.norm then rec.factor = {q = norm_factor(att, pre.q, 'q'), k = norm_factor(att, pre.k, 'k')} end
  return rec
end

-- What each layer's MLP output holds besides the skip and the sources
-- (T, D): b_dec, and the first position's whole output (no nodes there)
local function constants(c, state, feats, errors, T)
  local out = {}
  for m = 1, c.cfg.n_layers do
    local x = state.x[m][1]:to(c.W_enc.dtype)
    local v = state.out[m][1]:to(c.W_enc.dtype) - errors[m]
    if c.W_skip then v = v - x:matmul(c.W_skip[m]:t():to(x.dtype)) end
    for l, src in pairs(feats.sources) do
      local W = c:decoder(l):detach()  -- (F, width, D)
      if m >= l and m - l < W:size(2) then
        local writes = W:select(2, m - l + 1):index_select(1, src.feature) * src.activation:to(W.device):view(-1, 1)  -- (count, D)
        local at = src.pos:to(v.device):view(1, -1):eq(torch.arange(1, T + 1):to(v.device):view(-1, 1)):to(v.dtype)  -- (T, count)
        v = v - at:matmul(writes:to(v.device, v.dtype))
      end
    end
    out[m] = v:detach()
  end
  return out
end

-- The frozen model with every source taken out: the queries and keys (T, H, D) of the constant part
local function constant_run(model, c, locs, frozen, embed, att, ids, rec, const)
  local state, cap = {x = {}, same = {}}, {}
  local hs = graph.internal.capture_inputs(model, locs, state)
  for _, name in ipairs(frozen) do hs[#hs + 1] = hooks.replace(model, name, function() return rec[name] end) end
  for m, loc in ipairs(locs) do
    hs[#hs + 1] = hooks.replace(model, loc.output, function(t, _, input)
      if state.same[m] then state.x[m] = input end
      local v = const[m]:unsqueeze(1)
      if c.W_skip then v = v + state.x[m]:to(c.W_enc.dtype):matmul(c.W_skip[m]:t()) end
      return v:to(t.device, t.dtype)
    end)
  end
  hs[#hs + 1] = hooks.replace(model, embed, function(t) return t * 0 end)
  freeze_norm(model, att, rec, hs)
  for _, p in ipairs{'q', 'k'} do
    hs[#hs + 1] = hooks.replace(model, att[p], function(t) cap[p] = t[1]:detach():float():cpu() end)
  end
  run(model, ids, hs)
  return cap
end

-- Each source's part of one head's query (or key) at pos: (S, D), from a
-- backward pass of D targets, the components of that vector
local function side(g, ctx, point, head, pos)
  local cap = {}
  -- attached before the backward's own hooks, it reads the query (key) before they detach it (hooks run in that order)
  local capture = {hooks.replace(g.model, point, function(t) cap.t = t:select(3, head) end)}  -- (B, T, D)
  freeze_norm(g.model, ctx.att, ctx.rec, capture)
  local batch = {}
  for d = 1, ctx.att.D do
    local e = torch.zeros({ctx.att.D})
    e[d] = 1
    batch[d] = {kind = 'qk', pos = pos, vec = e, read = function() return cap.t end}
  end
  local I = graph.internal
  local grads, tgrad = hooks.with(hooks.group(capture), function()
    return I.backward(g.model, ctx.c, ctx.locs, ctx.frozen, ctx.final, ctx.embed, g.input_tokens:to(g.model:device()), batch)
  end)
  return I.rows(ctx.c, ctx.feats, ctx.errors, ctx.tokvecs, grads, tgrad, g.n_pos):float():cpu():t():contiguous()
end

-- The top k of |a_i · b_j| · scale over the rows of A (n, D) and B (m, D),
-- a block of rows at a time: values, i, j
local function top_pairs(A, B, scale, k)
  local vals, is, js = {}, {}, {}
  if A:size(1) == 0 or B:size(1) == 0 then return vals, is, js end
  local rows = math.max(1, math.floor(2 ^ 22 / B:size(1)))
  local cand_v, cand_i = {}, {}
  for s = 1, A:size(1), rows do
    local r = math.min(rows, A:size(1) - s + 1)
    local P = A:narrow(1, s, r):matmul(B:t()):mul(scale):view(-1)  -- (r · m)
    local kk = math.min(k, P:size(1))
    local _, at = P:abs():topk(kk)
    cand_v[#cand_v + 1] = P:index_select(1, at)
    cand_i[#cand_i + 1] = at + (s - 1) * B:size(1)
  end
  local v, flat = torch.cat(cand_v), torch.cat(cand_i)
  local _, order = v:abs():topk(math.min(k, v:size(1)))
  for _, o in ipairs(order:tolist()) do
    local f = flat[o]:item() - 1
    vals[#vals + 1], is[#is + 1], js[#js + 1] = v[o]:item(), math.floor(f / B:size(1)) + 1, f % B:size(1) + 1
  end
  return vals, is, js
end

-- The result: sae.QK
local QK = {__typename = 'sae.QK'}
QK.__index = QK

-- r:node(i) -> {kind = 'feature'|'error'|'token', layer, pos, feature, name}: source i (sae.attribute's order:
-- active features, error nodes layer by layer, token embeddings)
function QK:node(i)
  local n, T = self.n_features, self.n_pos
  if i <= n then
    local l, p, f = self._features[i][1], self._features[i][2], self._features[i][3]
    return {kind = 'feature', layer = l, pos = p, feature = f, index = i, name = ('L%d F%d @%d'):format(l, f, p)}
  elseif i <= n + self.n_layers * T then
    local m, p = math.floor((i - n - 1) / T) + 1, (i - n - 1) % T + 1
    return {kind = 'error', layer = m, pos = p, index = i, name = ('error L%d @%d'):format(m, p)}
  end
  local p = i - n - self.n_layers * T
  local id = self._tokens[p]
  local text = self._decode and self._decode(id)
  return {kind = 'token', pos = p, index = i, name = text and ("token '%s' @%d"):format(text, p) or ('token %d @%d'):format(id, p)}
end

function QK:__tostring()
  local lines = {('sae.QK(layer %d, head %d, query @%d, key @%d): score %.6g (the model\'s %.6g), pattern %.4g'):format(
    self.layer, self.head, self.query_pos, self.key_pos, self.score, self.clean_score, self.pattern)}
  lines[#lines + 1] = ('  %-24s %-24s %12s'):format('query side', 'key side', 'contribution')
  for _, p in ipairs(self.pairs) do
    lines[#lines + 1] = ('  %-24s %-24s %12.5g'):format(p.query.name, p.key.name, p.contribution)
  end
  local cst = self.constant
  lines[#lines + 1] = ('  %-24s %-24s %12.5g'):format('bias', '(key sources)', cst.query)
  lines[#lines + 1] = ('  %-24s %-24s %12.5g'):format('(query sources)', 'bias', cst.key)
  lines[#lines + 1] = ('  %-24s %-24s %12.5g'):format('bias', 'bias', cst.both)
  return table.concat(lines, '\n')
end

-- M.qk(g, layer, head, {query_pos = T, key_pos, top_k = 20}) -> sae.QK: head `head` of layer `layer` (from 1), its
-- score from query_pos to key_pos (the key it attends to most by default) split over pairs of sources.
-- Fields: score (the sum of every pair and constant), clean_score and pattern (the model's, read at the scores and
-- pattern points), pairs (the top_k {query, key, contribution}, nodes as r:node gives, by |contribution|),
-- query_totals and key_totals (S: each source's contributions summed over the other side's sources), constant
-- {query = a_0·Σb_t, key = Σa_s·b_0, both = a_0·b_0} (times the scale), query_vectors and key_vectors (S, D: a_s, b_t),
-- query_constant and key_constant (D: a_0, b_0), scale
function M.qk(g, layer, head, opts)
  if nn.typename(g) ~= 'sae.Graph' then
    error(('%s: the graph must be what sae.attribute returns, got %s'):format(WHERE, nn.typename(g) or type(g)), 3)
  end
  opts = options.check(opts, {'query_pos', 'key_pos', 'top_k'}, WHERE, 3)
  local T, L = g.n_pos, g.n_layers
  whole(layer, 'layer', 1, L, 'the graph\'s layers')
  local att = attention(g.model, layer)
  whole(head, 'head', 1, att.H, ('layer %d\'s heads'):format(layer))
  local q = whole(opts.query_pos or T, 'query_pos', 1, T, 'the prompt\'s positions')
  local top_k = opts.top_k or 20
  if type(top_k) ~= 'number' or top_k ~= top_k or top_k < 1 or top_k ~= math.floor(top_k) or top_k == math.huge then
    error(('%s: top_k must be a whole number >= 1, got %s'):format(WHERE, tostring(top_k)), 3)
  end
  local c = g.transcoders
  local I = graph.internal
  local ids = g.input_tokens:to(g.model:device())
  local ctx = {c = c, att = att}
  ctx.locs, ctx.frozen, ctx.final, ctx.embed = I.layout(g.model, c)
  local rec = record(g.model, ctx.frozen, att, ids)
  ctx.rec = rec
  local k = opts.key_pos
  if k == nil then
    local _, at = rec.pattern[head][q]:max(1)
    k = at:item()
  end
  whole(k, 'key_pos', 1, T, 'the prompt\'s positions')
  if k > q then
    error(('%s: key_pos %d is after query_pos %d (the head attends to positions up to the query\'s)'):format(WHERE, k, q), 3)
  end
  if att.window > 0 and q - k >= att.window then
    error(('%s: key_pos %d is outside layer %d\'s sliding window of %d from query_pos %d'):format(WHERE, k, layer, att.window, q), 3)
  end
  local state = I.clean_run(g.model, ctx.locs, ctx.final, ctx.embed, ids)
  ctx.feats, ctx.errors = I.nodes(c, state, T)
  local n = #ctx.feats.layer
  if n ~= g.active_features:size(1) then
    error(('%s: the transcoders give %d active features, the graph has %d (changed since sae.attribute?)'):format(
      WHERE, n, g.active_features:size(1)), 3)
  end
  ctx.tokvecs = state.tokens[1]:detach()
  local kv = math.floor((head - 1) / (att.H / att.KV)) + 1  -- the key head of a group of query heads (repeat_interleave)
  local A = side(g, ctx, att.q, head, q)  -- (S, D)
  local B = side(g, ctx, att.k, kv, k)
  local cap = constant_run(g.model, c, ctx.locs, ctx.frozen, ctx.embed, att, ids, rec, constants(c, state, ctx.feats, ctx.errors, T))
  local a0, b0 = cap.q[q][head], cap.k[k][kv]
  local s = att.scale
  local asum, bsum = A:sum(1), B:sum(1)
  local r = setmetatable({layer = layer, head = head, query_pos = q, key_pos = k, scale = s, n_features = n, n_layers = L,
    n_pos = T, query_vectors = A, key_vectors = B, query_constant = a0, key_constant = b0,
    query_totals = A:matmul(bsum) * s, key_totals = B:matmul(asum) * s,
    constant = {query = a0:dot(bsum):item() * s, key = asum:dot(b0):item() * s, both = a0:dot(b0):item() * s},
    clean_score = rec.scores[head][q][k]:item(), pattern = rec.pattern[head][q][k]:item(),
    _features = g.active_features:tolist(), _tokens = g.input_tokens:tolist()}, QK)
  r.score = r.query_totals:double():sum():item() + r.constant.query + r.constant.key + r.constant.both
  local tok = rawget(g.model, 'tokenizer')
  if type(tok) == 'table' and type(tok.decode) == 'function' then
    r._decode = function(id) return tok:decode({id}) end
  end
  -- pairs among the sources either side reaches (the rest are zero)
  local every = torch.arange(1, A:size(1) + 1):long():cpu()
  local qi, ki = every:masked_select(A:abs():sum(2):gt(0)), every:masked_select(B:abs():sum(2):gt(0))
  local vals, is, js = top_pairs(A:index_select(1, qi), B:index_select(1, ki), s, top_k)
  r.pairs = {}
  for i = 1, #vals do
    r.pairs[i] = {query = r:node(qi[is[i]]:item()), key = r:node(ki[js[i]]:item()), contribution = vals[i]}
  end
  return r
end

return M
