-- weights: what a head does, read from its weights alone (Elhage et al.,
-- "A Mathematical Framework for Transformer Circuits"; TransformerLens's
-- FactoredMatrix and composition scores).
--
-- Residual vectors are rows, as in TransformerLens: a head reads x (1, C)
-- through W_V (C, D) and writes x W_V W_O, W_O (D, C); its scores are
-- x_q W_Q W_K^T x_k^T. So
--   weights.ov(model, layer, head)  = W_V W_O      (C x C, inner D)
--   weights.qk(model, layer, head)  = W_Q W_K^T    (C x C, inner D)
-- are kept factored: a weights.Factored holds A and B and answers its norm,
-- singular values and SVD from QR factors of A and B^T, never forming A B
-- (f:AB() forms it when asked). Weights are taken as float64 copies, as the
-- checkpoint holds them: no layer norm is folded in, and a RoPE head's QK
-- circuit is its weights without the rotation (as TransformerLens reports it).
-- Grouped key/value heads are expanded: query head h reads key/value head
-- ceil(h / (heads / kv_heads)).
local torch = require('anatomy.torch')
local nn = require('anatomy.nn')
local points = require('anatomy.probe.points')
local options = require('anatomy.torch.options')
local charts = require('anatomy.render.charts')
local terminal = require('anatomy.render.terminal')

local weights = {}

local Factored = {}
Factored.__index = Factored
Factored.__typename = 'weights.Factored'
weights.Factored = Factored

local function is_tensor(x) return torch.is_tensor(x) end

local function shape_text(t)
  local s = t:size()
  local parts = {}
  for i, v in ipairs(s) do parts[i] = tostring(v) end
  return table.concat(parts, ' x ')
end

local function new(A, B, meta)
  local f = setmetatable({A = A, B = B, ldim = A:size(1), mdim = A:size(2), rdim = B:size(2)}, Factored)
  for k, v in pairs(meta or {}) do f[k] = v end
  return f
end

-- weights.factored(A, B) -> the matrix A B (A: n x m, B: m x p), kept as its factors
function weights.factored(A, B)
  local where = 'weights.factored'
  if not is_tensor(A) or A:dim() ~= 2 then error(('%s: A must be a matrix (a 2-D tensor), got %s'):format(where, is_tensor(A) and ('shape ' .. shape_text(A)) or type(A)), 2) end
  if not is_tensor(B) or B:dim() ~= 2 then error(('%s: B must be a matrix (a 2-D tensor), got %s'):format(where, is_tensor(B) and ('shape ' .. shape_text(B)) or type(B)), 2) end
  if A:size(2) ~= B:size(1) then
    error(('%s: A is %s and B is %s: A\'s columns (%d) must equal B\'s rows (%d)'):format(where, shape_text(A), shape_text(B), A:size(2), B:size(1)), 2)
  end
  if not A:isfinite():all():item() or not B:isfinite():all():item() then
    error(('%s: the factors hold NaN or infinite values'):format(where), 2)
  end
  return new(A, B)
end

-- f:AB() -> the full matrix A B (ldim x rdim)
function Factored:AB() return self.A:matmul(self.B) end

-- f:t() -> the transpose, B^T A^T, still factored
function Factored:t() return new(self.B:t(), self.A:t()) end

-- f:matmul(x) -> f x, factored: x a matrix (rdim x p) or another Factored
function Factored:matmul(x)
  if getmetatable(x) == Factored then
    if self.rdim ~= x.ldim then error(('f:matmul: f is %d x %d and x is %d x %d'):format(self.ldim, self.rdim, x.ldim, x.rdim), 2) end
    if self.mdim <= x.mdim then return new(self.A, self.B:matmul(x.A):matmul(x.B)) end
    return new(self.A:matmul(self.B):matmul(x.A), x.B)
  end
  if not is_tensor(x) or x:dim() ~= 2 then error('f:matmul: x must be a matrix or a weights.Factored', 2) end
  if x:size(1) ~= self.rdim then error(('f:matmul: f is %d x %d and x is %s'):format(self.ldim, self.rdim, shape_text(x)), 2) end
  return new(self.A, self.B:matmul(x))
end

-- f:rmatmul(x) -> x f, factored: x a matrix (p x ldim)
function Factored:rmatmul(x)
  if not is_tensor(x) or x:dim() ~= 2 then error('f:rmatmul: x must be a matrix', 2) end
  if x:size(2) ~= self.ldim then error(('f:rmatmul: x is %s and f is %d x %d'):format(shape_text(x), self.ldim, self.rdim), 2) end
  return new(x:matmul(self.A), self.B)
end

-- The core: A = Qa Ra, B^T = Qb Rb (reduced QR), so A B = Qa (Ra Rb^T) Qb^T
-- with Qa, Qb orthonormal columns: the small middle carries the norm and
-- the singular values.
function Factored:_core()
  if not rawget(self, '_qa') then
    local qa, ra = torch.linalg.qr(self.A)
    local qb, rb = torch.linalg.qr(self.B:t())
    rawset(self, '_qa', qa); rawset(self, '_qb', qb); rawset(self, '_m', ra:matmul(rb:t()))
  end
  return self._qa, self._m, self._qb
end

-- f:norm() -> the Frobenius norm of A B (a number)
function Factored:norm()
  local _, m = self:_core()
  return torch.linalg.norm(m):item()
end

-- f:singular_values() -> the min(ldim, mdim, rdim) singular values of A B, largest first (1-D tensor)
function Factored:singular_values()
  local _, m = self:_core()
  return torch.linalg.svdvals(m)
end

-- f:svd() -> U (ldim x r), S (r), Vh (r x rdim) with A B = U diag(S) Vh, r = min(ldim, mdim, rdim)
function Factored:svd()
  local qa, m, qb = self:_core()
  local u, s, vh = torch.linalg.svd(m, false)
  return qa:matmul(u), s, vh:matmul(qb:t())
end

function Factored:__tostring()
  local what = rawget(self, 'kind') and ('%s circuit of %s head %d, '):format(self.kind:upper(), self.layer_name, self.head) or ''
  return ('weights.Factored: %s%d x %d through %d (%s)'):format(what, self.ldim, self.rdim, self.mdim, self.A.dtype)
end

-- The attention of layer `index`: the first module inside it publishing z or pattern.
local function attention_of(model, all, index, where, level)
  local path, block = all[index][1], all[index][2]
  for name, c in block:named_modules() do
    for _, p in ipairs(name ~= '' and c:hook_points() or {}) do
      if p == 'z' or p == 'pattern' then
        local kind = nn.typename(c)
        if kind ~= 'nn.Attention' and kind ~= 'nn.RoPEAttention' then
          error(('%s: %s.%s is %s, whose heads have no W_Q, W_K, W_V, W_O to read (nn.Attention and nn.RoPEAttention have)')
            :format(where, path, name, kind), level + 1)
        end
        return c, path .. '.' .. name
      end
    end
  end
  error(('%s: layer %s has no attention (a child publishing z or pattern)'):format(where, path), level + 1)
end

-- One layer's attention weights per head (weights.attention, below).
local function read_attention(model, layer, where, level)
  level = level + 1
  local chosen, all = points.pick_layers(model, layer, where, level)
  if #chosen ~= 1 then error(('%s: layer must be one layer, got %d'):format(where, #chosen), level) end
  local attn, name = attention_of(model, all, chosen[1], where, level)
  local made = rawget(attn, '_made_with') or {}
  local C, H = made.dim, made.heads
  local KV = made.kv_heads or H
  local D = made.head_dim or math.floor(C / H)
  local out = {heads = H, kv_heads = KV, head_dim = D, name = name, layer = chosen[1], layer_name = all[chosen[1]][1],
    rotary = nn.typename(attn) == 'nn.RoPEAttention'}
  local function per_head(w, n)  -- a Linear's weight (n*D, C) -> (n, C, D)
    return w:detach():double():reshape(n, D, C):transpose(2, 3):contiguous()
  end
  local function expand(t)  -- (KV, ...) -> (H, ...): query head h reads kv head ceil(h / (H / KV))
    if KV == H then return t end
    local sizes, grouped = t:size(), t:size()
    table.insert(grouped, 2, math.floor(H / KV))
    sizes[1] = H
    return t:unsqueeze(2):expand(unpack(grouped)):reshape(unpack(sizes)):contiguous()
  end
  local params = {}
  for pname, p in attn:named_parameters() do params[pname] = p end
  local function bias(b, n)  -- (n*D) -> (H, D): a query's bias as it is, a shared key's or value's expanded to its query heads
    if not b then return nil end
    local t = b:detach():double():reshape(n, D)
    return n == H and t or expand(t)
  end
  if out.rotary then
    out.W_Q, out.W_K, out.W_V = per_head(params['q.weight'], H), expand(per_head(params['k.weight'], KV)), expand(per_head(params['v.weight'], KV))
    out.b_Q, out.b_K, out.b_V = bias(params['q.bias'], H), bias(params['k.bias'], KV), bias(params['v.bias'], KV)
    out.W_O = params['o.weight']:detach():double():reshape(C, H, D):permute(2, 3, 1):contiguous()  -- (H, D, C)
    out.b_O = params['o.bias'] and params['o.bias']:detach():double() or nil
  else
    local w = params['qkv.weight']  -- (3C, C): q, k, v stacked
    out.W_Q, out.W_K, out.W_V = per_head(w:narrow(1, 1, C), H), per_head(w:narrow(1, C + 1, C), H), per_head(w:narrow(1, 2 * C + 1, C), H)
    local b = params['qkv.bias']
    if b then out.b_Q, out.b_K, out.b_V = bias(b:narrow(1, 1, C), H), bias(b:narrow(1, C + 1, C), H), bias(b:narrow(1, 2 * C + 1, C), H) end
    out.W_O = params['proj.weight']:detach():double():reshape(C, H, D):permute(2, 3, 1):contiguous()
    out.b_O = params['proj.bias'] and params['proj.bias']:detach():double() or nil
  end
  return out
end

-- weights.attention(model, layer) -> {W_Q, W_K, W_V (H, C, D), W_O (H, D, C),
-- b_Q, b_K, b_V (H, D) or nil, b_O (C) or nil, heads, kv_heads, head_dim,
-- name, rotary}: layer `layer`'s attention weights per head, float64 copies,
-- keys and values expanded to every query head (TransformerLens's layout).
function weights.attention(model, layer) return read_attention(model, layer, 'weights.attention', 2) end

local function head_of(a, head, where, level)
  if type(head) ~= 'number' or head % 1 ~= 0 or head < 1 or head > a.heads then
    error(('%s: head must be in 1..%d (%s has %d heads), got %s'):format(where, a.heads, a.name, a.heads, tostring(head)), level + 1)
  end
  return head
end

-- weights.ov(model, layer, head) -> the head's OV circuit W_V W_O (C x C, factored)
function weights.ov(model, layer, head)
  local a = read_attention(model, layer, 'weights.ov', 2)
  local h = head_of(a, head, 'weights.ov', 2)
  return new(a.W_V[h], a.W_O[h], {kind = 'ov', model = model, layer = a.layer, layer_name = a.layer_name, head = h})
end

-- weights.qk(model, layer, head) -> the head's QK circuit W_Q W_K^T (C x C, factored):
-- query-side rows, key-side columns
function weights.qk(model, layer, head)
  local a = read_attention(model, layer, 'weights.qk', 2)
  local h = head_of(a, head, 'weights.qk', 2)
  return new(a.W_Q[h], a.W_K[h]:t(), {kind = 'qk', model = model, layer = a.layer, layer_name = a.layer_name, head = h})
end

-- weights.embedding(model) -> W_E (V x C): the token embedding's weight
function weights.embedding(model, level)
  level = (level or 1) + 1
  local ok, name = pcall(points.from_transformer_lens, model, 'hook_embed', 1)
  if not ok then error(('weights: the model has no token embedding: %s'):format(tostring(name):gsub('^[^\n]-:%d+: ', '')), level) end
  local found, m = pcall(points.module, model, name)
  if not found then  -- a model's own hook point (Gemma's embed, scaled): its embedding's weight, as TransformerLens's W_E
    local names = rawget(model, 'pretrained_names') or model.pretrained_names
    local e = type(names) == 'table' and model[names.embed]
    if not e then error(('weights: the model has no token embedding: %s'):format(tostring(m):gsub('^[^\n]-:%d+: ', '')), level) end
    m = e
  end
  return m.weight:detach():double()
end

-- weights.unembedding(model) -> W_U (C x V): the head's weight, transposed
-- (model:unembedding() where the model names it; a child head or lm_head)
function weights.unembedding(model, level)
  level = (level or 1) + 1
  local w
  if type(model.unembedding) == 'function' then
    w = model:unembedding()
  else
    for _, name in ipairs({'head', 'lm_head', 'unembed'}) do
      local ok, m = pcall(function() return model[name] end)
      if ok and nn.is_module(m) and nn.typename(m) == 'nn.Linear' then w = m.weight; break end
    end
  end
  if not is_tensor(w) then
    error(('weights: %s names no unembedding (define %s:unembedding() returning the head\'s weight, V x C)')
      :format(nn.typename(model), nn.typename(model)), level)
  end
  return w:detach():double():t()
end

-- f:tokens{n = 3, k = 5, tokenizer} -> the top n singular directions of a
-- head's circuit (from weights.ov or weights.qk), each projected onto the
-- vocabulary: for OV, the tokens whose embeddings the direction reads
-- (W_E u) and the tokens whose logits it writes (v W_U); for QK, the query
-- tokens (W_E u) and the key tokens (W_E v). A singular pair's sign is
-- arbitrary, so each direction gives both ends: top (the k highest on the
-- read side with the k highest on the write side) and bottom (the k lowest
-- of each), the sign fixed so that the write side's largest entry is positive.
-- Rows: {index, value (singular value), reads = {ids}, writes = {ids},
-- reads_bottom, writes_bottom, and with a tokenizer the same as texts (..._text)}.
function Factored:tokens(opts)
  local where = 'f:tokens'
  opts = options.check(opts, {'n', 'k', 'tokenizer'}, where, 2)
  if not rawget(self, 'kind') then error(('%s: only a head\'s circuit (weights.ov, weights.qk) knows its vocabulary'):format(where), 2) end
  local n, k = options.whole(opts.n, 'n', where, 3), options.whole(opts.k, 'k', where, 5)
  local tok = opts.tokenizer or rawget(self.model, 'tokenizer')
  local E = weights.embedding(self.model, 2)
  local U, S, Vh = self:svd()
  n = math.min(n, S:size(1))
  local read = E:matmul(U:narrow(2, 1, n))                      -- (V, n)
  local write = self.kind == 'ov' and Vh:narrow(1, 1, n):matmul(weights.unembedding(self.model, 2))  -- (n, V)
    or Vh:narrow(1, 1, n):matmul(E:t())
  k = math.min(k, E:size(1))
  local rows = {}
  for i = 1, n do
    local r, w = read:select(2, i), write[i]
    local _, at = w:abs():max(1)
    if w[at:item()]:item() < 0 then r, w = -r, -w end
    local function ends(v)
      local _, hi = v:topk(k)
      local _, lo = (-v):topk(k)
      return hi:tolist(), lo:tolist()
    end
    local row = {index = i, value = S[i]:item()}
    row.reads, row.reads_bottom = ends(r)
    row.writes, row.writes_bottom = ends(w)
    if tok then
      for _, key in ipairs({'reads', 'writes', 'reads_bottom', 'writes_bottom'}) do
        local texts = {}
        for j, id in ipairs(row[key]) do texts[j] = tok:decode({id}) end
        row[key .. '_text'] = texts
      end
    end
    rows[i] = row
  end
  return setmetatable(rows, {__tostring = function(t)
    local sides = self.kind == 'ov' and {'reads', 'writes'} or {'query', 'key'}
    local lines = {('%s: the top %d singular directions in tokens (%s -> %s)'):format(tostring(self), #t, sides[1], sides[2])}
    local function show(row, key)
      local list = row[key .. '_text'] or row[key]
      local parts = {}
      for j, v in ipairs(list) do parts[j] = type(v) == 'string' and terminal.token_label(v, 12) or ('#' .. v) end
      return table.concat(parts, '  ')
    end
    for _, row in ipairs(t) do
      lines[#lines + 1] = ('%2d  s = %-9.4g %s -> %s'):format(row.index, row.value, show(row, 'reads'), show(row, 'writes'))
      lines[#lines + 1] = ('    %-13s %s -> %s'):format('(other end)', show(row, 'reads_bottom'), show(row, 'writes_bottom'))
    end
    return table.concat(lines, '\n')
  end})
end

-- Composition -----------------------------------------------------------

local Scores = {}
Scores.__index = Scores
Scores.__typename = 'weights.CompositionScores'
weights.CompositionScores = Scores

local modes = {q = 'Q', k = 'K', v = 'V'}

-- The Frobenius norms of R_a M R_b^T over a batch (..., D, D): sqrt of the sum of squares of the last two dims.
local function fro(t)
  local d = t:dim()
  return t:pow(2):sum(d):sum(d - 1):sqrt()
end

-- weights.composition(model, mode) -> scores: TransformerLens's composition
-- scores, mode 'q', 'k' or 'v' (or 'Q', 'K', 'V'): for head a of an earlier
-- layer and head b of a later one, |OV_a R_b|_F / (|OV_a|_F |R_b|_F) with
-- R_b = W_Q W_K^T (Q), its transpose W_K W_Q^T (K), or OV_b (V).
-- scores.scores is (L, H, L, H) float64, [la][ha][lb][hb], 0 unless la < lb
-- (TransformerLens's all_composition_scores, 1-based); print(scores),
-- scores:top(k), scores:svg(). A list of modes gives a table by mode.
function weights.composition(model, mode)
  local where = 'weights.composition'
  if type(mode) == 'table' then
    local out = {}
    for _, m in ipairs(mode) do out[m] = weights.composition(model, m) end
    return out
  end
  if type(mode) ~= 'string' or not (modes[mode] or modes[mode:lower()] == mode) then
    error(("%s: mode must be 'q', 'k' or 'v' (or 'Q', 'K', 'V'), got %s"):format(where, tostring(mode)), 2)
  end
  mode = mode:lower()
  local all, why = model:layers()
  if not all then error(('%s: %s'):format(where, why), 2) end
  local L = #all
  -- per layer: R factors of the QR of the left factor and of the right factor's transpose
  local function rfac(t) local _, r = torch.linalg.qr(t); return r end
  local per = {}
  for l = 1, L do
    local a = read_attention(model, l, where, 2)
    local X, Y  -- the later head's circuit R = X Y: X (H, C, D), Y (H, D, C)
    if mode == 'q' then X, Y = a.W_Q, a.W_K:transpose(2, 3)
    elseif mode == 'k' then X, Y = a.W_K, a.W_Q:transpose(2, 3)
    else X, Y = a.W_V, a.W_O end
    local rv, ro = rfac(a.W_V), rfac(a.W_O:transpose(2, 3))
    local rx, ry = rfac(X), rfac(Y:transpose(2, 3))
    per[l] = {heads = a.heads, W_O = a.W_O, X = X, rv = rv, ry = ry,
      ov_norm = fro(rv:matmul(ro:transpose(2, 3))), r_norm = fro(rx:matmul(ry:transpose(2, 3)))}
  end
  local H = per[1].heads
  for l = 2, L do
    if per[l].heads ~= H then error(('%s: layers %s and %s have different numbers of heads (%d, %d)'):format(where, all[1][1], all[l][1], H, per[l].heads), 2) end
  end
  local scores = torch.zeros(L, H, L, H, {dtype = 'float64', device = per[1].W_O.device})
  for la = 1, L - 1 do
    local A = per[la]
    for lb = la + 1, L do
      local B = per[lb]
      -- OV_a R_b = V_a (O_a X_b) Y_b; its norm is |Rv_a (O_a X_b) Ry_b^T|
      local mid = A.W_O:unsqueeze(2):matmul(B.X:unsqueeze(1))                  -- (Ha, Hb, D, D)
      local core = A.rv:unsqueeze(2):matmul(mid):matmul(B.ry:transpose(2, 3):unsqueeze(1))
      local s = fro(core) / A.ov_norm:unsqueeze(2) / B.r_norm:unsqueeze(1)
      scores:select(1, la):select(2, lb):copy_(s)
    end
  end
  local names = {}
  for l = 1, L do names[l] = all[l][1] end
  return setmetatable({mode = mode, scores = scores, layers = names, heads = H}, Scores)
end

-- scores:top(k = 5) -> {{from = {layer, head}, to = {layer, head}, name, score}, ...}, highest first
function Scores:top(k)
  k = k or 5
  if type(k) ~= 'number' or k % 1 ~= 0 or k < 1 then error(('scores:top: k must be a positive whole number, got %s'):format(tostring(k)), 2) end
  local flat = self.scores:reshape(-1)
  local n = math.min(k, flat:size(1))
  local vals, idx = flat:topk(n)
  local out, L, H = {}, #self.layers, self.heads
  for i, id in ipairs(idx:tolist()) do
    local z = id - 1
    local hb, lb = z % H + 1, math.floor(z / H) % L + 1
    local ha, la = math.floor(z / (H * L)) % H + 1, math.floor(z / (H * L * H)) + 1
    local score = vals[i]:item()
    if score <= 0 then break end
    out[#out + 1] = {from = {layer = la, head = ha}, to = {layer = lb, head = hb}, score = score,
      name = ('%s head %d -> %s head %d'):format(self.layers[la], ha, self.layers[lb], hb)}
  end
  return out
end

local mode_text = {q = 'queries', k = 'keys', v = 'values'}

function Scores:__tostring()
  local lines = {('%s-composition scores: how much of each head\'s output (OV) a later head reads into its %s, '
    .. '|OV_a R_b| / (|OV_a| |R_b|)'):format(self.mode:upper(), mode_text[self.mode])}
  for _, t in ipairs(self:top(10)) do lines[#lines + 1] = ('  %-40s %.4f'):format(t.name, t.score) end
  return table.concat(lines, '\n')
end

-- scores:svg() -> a heatmap: rows the heads of every layer but the last,
-- columns the heads of every layer but the first; pairs that cannot compose
-- (the later head not later) are left blank
function Scores:svg()
  local L, H = #self.layers, self.heads
  local rows, cols, matrix = {}, {}, {}
  local s = self.scores:tolist()
  for la = 1, L - 1 do
    for ha = 1, H do
      local row = {}
      for lb = 2, L do
        for hb = 1, H do row[#row + 1] = la < lb and s[la][ha][lb][hb] or 0 / 0 end
      end
      rows[#rows + 1] = ('%s head %d'):format(self.layers[la], ha)
      matrix[#matrix + 1] = row
    end
  end
  for lb = 2, L do for hb = 1, H do cols[#cols + 1] = ('%s head %d'):format(self.layers[lb], hb) end end
  return charts.heatmap(('%s-composition scores'):format(self.mode:upper()), rows, cols, matrix, false,
    {xlabel = ('the later head (reads into its %s)'):format(mode_text[self.mode]), ylabel = 'the earlier head (writes, OV)',
     value = 'composition score', note = '|OV_a R_b|_F / (|OV_a|_F |R_b|_F); blank: the pair cannot compose'})
end

return weights
