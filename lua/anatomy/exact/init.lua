-- exact: a tiny transformer's forward pass in exact arithmetic.
--
--   local m = exact.model{vocab = {'a', 'b', 'c'}, E = {...}, P = {...}, Wq = 'I', ...}
--   local t = exact.trace(m, 'a b')
--   print(t)          -- every step, in order
--   t:step()          -- one step at a time (the REPL), new values highlighted
--   t:latex()         -- the same values as LaTeX
--
-- Weights are integers or fractions written as strings ('3/2'); every value
-- is a rational until an operation leaves the rationals (the softmax's e^s,
-- LayerNorm's square root); from there it is a named value, still exact
-- (exact/value.lua). The model: token embedding E, position table P, then
-- post-norm blocks x = LN(x + attn(x)); x = LN(x + MLP(x)), then logits
-- x·Eᵀ (tied) or x·U, and their argmax. Row-vector convention: Q = x·Wq.
local V = require 'anatomy.exact.value'

local exact = {}
exact.Q = V.Q
exact.sqrt, exact.exp, exact.relu = V.sqrt, V.exp, V.relu
exact.sign, exact.compare, exact.tonumber, exact.bounds = V.sign, V.compare, V.tonumber, V.bounds
exact.is_named, exact.is_rational = V.is_named, V.is_rational

-- exact.tostring(v): the exact form ('3/2', 'e^1/(e^1+e^2)', '√(2/3)').
function exact.tostring(v) return V.render(v) end
-- exact.latex(v): the same in LaTeX.
function exact.latex(v) return V.render(v, {latex = true}) end
-- exact.register(v): 'exact' for a rational, 'named' for a named value.
function exact.register(v) return V.is_named(v) and 'named' or 'exact' end

-- ---- errors: at the caller's line ------------------------------------------------

local library = '@' .. (debug.getregistry()['anatomy.lua_dir'] or '\0')
local function where()
  for level = 2, 50 do
    local info = debug.getinfo(level, 'Sl')
    if not info then break end
    if info.currentline > 0 and info.source:sub(1, #library) ~= library then
      return info.short_src .. ':' .. info.currentline .. ': '
    end
  end
  return ''
end
local function fail(fmt, ...) error(where() .. fmt:format(...), 0) end

-- ---- reading weights --------------------------------------------------------------

local function number(path, x)
  if V.is_rational(x) then return x end
  if type(x) == 'number' then
    if x ~= math.floor(x) or x ~= x then
      local hint = torch._exact.suggest(x)
      fail("exact.model: %s = %s is not exact; write fractions as strings%s", path, tostring(x),
        hint and (", e.g. '" .. hint .. "'") or '')
    end
    return V.Q(x)
  end
  if type(x) == 'string' then
    local ok, q = pcall(V.Q, x)
    if not ok then fail('exact.model: %s: %s', path, tostring(q):match('%((.*)%)$') or tostring(q)) end
    return q
  end
  fail('exact.model: %s must be an integer or a fraction string, got %s', path, type(x))
end

local function identity(n)
  local m = {}
  for i = 1, n do
    m[i] = {}
    for j = 1, n do m[i][j] = i == j and V.ONE or V.ZERO end
  end
  return m
end

-- A rows×cols matrix (either size may be nil: taken from the table); why_rows
-- and why_cols say where an expected size comes from. 'I' is the identity
-- when the matrix is square.
local function matrix(name, m, rows, cols, why_rows, why_cols)
  if m == 'I' then
    local n = rows or cols
    if not n or (rows and cols and rows ~= cols) then
      fail("exact.model: %s = 'I' needs a square shape, but %s must be %s×%s", name, name, rows or '?', cols or '?')
    end
    return identity(n)
  end
  if type(m) ~= 'table' or type(m[1]) ~= 'table' then
    fail('exact.model: %s must be a matrix (a table of rows), got %s', name, type(m))
  end
  if rows and #m ~= rows then
    fail('exact.model: %s has %d rows, expected %d (%s)', name, #m, rows, why_rows)
  end
  if not cols then cols, why_cols = #m[1], 'as ' .. name .. '[1]' end
  local out = {}
  for i, row in ipairs(m) do
    if type(row) ~= 'table' then fail('exact.model: %s[%d] must be a row (a table), got %s', name, i, type(row)) end
    if #row ~= cols then
      fail('exact.model: %s[%d] has %d entries, expected %d (%s)', name, i, #row, cols, why_cols)
    end
    out[i] = {}
    for j = 1, cols do out[i][j] = number(('%s[%d][%d]'):format(name, i, j), row[j]) end
  end
  return out
end

local function vector(name, v, n, why)
  if type(v) ~= 'table' then fail('exact.model: %s must be a vector (a table), got %s', name, type(v)) end
  if #v ~= n then fail('exact.model: %s has %d entries, expected %d (%s)', name, #v, n, why) end
  local out = {}
  for i = 1, n do out[i] = number(('%s[%d]'):format(name, i), v[i]) end
  return out
end

local function const_vector(n, x)
  local out = {}
  for i = 1, n do out[i] = x end
  return out
end

local BLOCK_KEYS = {'Wq', 'Wk', 'Wv', 'Wo', 'bq', 'bk', 'bv', 'bo', 'heads', 'scale', 'causal',
  'W1', 'b1', 'act', 'W2', 'b2', 'gamma', 'beta', 'ln1', 'ln2', 'eps'}
local MODEL_KEYS = {'vocab', 'E', 'P', 'U', 'blocks'}

local function check_keys(cfg, allowed, what)
  local set = {}
  for _, k in ipairs(allowed) do set[k] = true end
  for k in pairs(cfg) do
    if not set[k] then
      local names = {}
      for _, n in ipairs(allowed) do names[#names + 1] = n end
      fail("exact.model: unknown key '%s' in %s (expected %s)", tostring(k), what, table.concat(names, ', '))
    end
  end
end

local function norm_params(name, spec, shared, d)
  spec = spec or {}
  if type(spec) ~= 'table' then fail('exact.model: %s must be a table {gamma =, beta =}, got %s', name, type(spec)) end
  local gamma = spec.gamma or shared.gamma
  local beta = spec.beta or shared.beta
  return {
    gamma = gamma and vector(name .. '.gamma', gamma, d, 'd, the width of E') or const_vector(d, V.ONE),
    beta = beta and vector(name .. '.beta', beta, d, 'd, the width of E') or const_vector(d, V.ZERO),
    eps = number(name .. '.eps', spec.eps or shared.eps or 0),
  }
end

local function read_block(cfg, d, label)
  check_keys(cfg, BLOCK_KEYS, label)
  local b = {}
  local why = 'rows = d = ' .. d .. ', the width of E'
  if cfg.Wq == nil or cfg.Wk == nil or cfg.Wv == nil then fail('exact.model: %s needs Wq, Wk and Wv', label) end
  b.Wq = matrix('Wq', cfg.Wq, d, cfg.Wq == 'I' and d or nil, why)
  local dk = #b.Wq[1]
  b.Wk = matrix('Wk', cfg.Wk, d, dk, why, 'the width of Wq')
  b.Wv = matrix('Wv', cfg.Wv, d, cfg.Wv == 'I' and d or nil, why)
  local dv = #b.Wv[1]
  if cfg.Wo ~= nil then
    b.Wo = matrix('Wo', cfg.Wo, dv, d, 'the width of Wv', 'd = ' .. d)
  elseif dv ~= d then
    fail('exact.model: Wv is %d×%d, so an output projection Wo (%d×%d) is needed to return to d = %d', d, dv, dv, d, d)
  end
  b.bq = cfg.bq and vector('bq', cfg.bq, dk, 'the width of Wq')
  b.bk = cfg.bk and vector('bk', cfg.bk, dk, 'the width of Wk')
  b.bv = cfg.bv and vector('bv', cfg.bv, dv, 'the width of Wv')
  b.bo = cfg.bo and vector('bo', cfg.bo, d, 'd')
  b.heads = cfg.heads or 1
  if type(b.heads) ~= 'number' or b.heads < 1 or b.heads ~= math.floor(b.heads) or dk % b.heads ~= 0 or dv % b.heads ~= 0 then
    fail('exact.model: heads = %s must be a positive integer dividing the widths of Wq (%d) and Wv (%d)', tostring(cfg.heads), dk, dv)
  end
  if cfg.scale == 'sqrt' then
    b.scale = V.div(V.ONE, V.sqrt(V.Q(dk / b.heads)))  -- 1/√d_head
  else
    b.scale = number('scale', cfg.scale or 1)
  end
  b.causal = cfg.causal ~= false
  if (cfg.W1 == nil) ~= (cfg.W2 == nil) then fail('exact.model: %s has %s without %s', label, cfg.W1 and 'W1' or 'W2', cfg.W1 and 'W2' or 'W1') end
  if cfg.W1 ~= nil then
    b.W1 = matrix('W1', cfg.W1, d, cfg.W1 == 'I' and d or nil, why)
    local h = #b.W1[1]
    b.W2 = matrix('W2', cfg.W2, h, d, 'the width of W1', 'd = ' .. d)
    b.b1 = cfg.b1 and vector('b1', cfg.b1, h, 'the width of W1')
    b.b2 = cfg.b2 and vector('b2', cfg.b2, d, 'd')
    b.act = cfg.act or 'relu'
    if b.act ~= 'relu' and b.act ~= 'identity' then
      fail("exact.model: act must be 'relu' or 'identity', got '%s'", tostring(b.act))
    end
  end
  local shared = {gamma = cfg.gamma, beta = cfg.beta, eps = cfg.eps}
  b.ln1 = norm_params('ln1', cfg.ln1, shared, d)
  if b.W1 then b.ln2 = norm_params('ln2', cfg.ln2, shared, d) end
  return b
end

local Model = {}
Model.__index = Model

-- exact.model{vocab=, E=, P=, Wq=, Wk=, Wv=, [Wo=], W1=, W2=, [act='relu'],
--   [gamma=, beta=, eps=0 | ln1=, ln2=], [scale=1 | 'sqrt'], [heads=1], [causal=true],
--   [U=]} — one block from the top-level fields, or blocks = {{Wq=...}, ...}.
function exact.model(cfg)
  if type(cfg) ~= 'table' then fail('exact.model: expected a table of weights, got %s', type(cfg)) end
  local allowed = {}
  for _, k in ipairs(MODEL_KEYS) do allowed[#allowed + 1] = k end
  if not cfg.blocks then for _, k in ipairs(BLOCK_KEYS) do allowed[#allowed + 1] = k end end
  check_keys(cfg, allowed, 'the model')
  if cfg.E == nil then fail('exact.model: needs E, the token embedding') end
  if cfg.P == nil then fail('exact.model: needs P, the position table') end
  local m = setmetatable({}, Model)
  -- vocabulary and embedding: E as rows in vocab order, or as {token = row}
  local rows = {}
  if cfg.vocab then
    if type(cfg.vocab) ~= 'table' or #cfg.vocab == 0 then fail('exact.model: vocab must be a list of token names') end
    m.vocab = {}
    for i, t in ipairs(cfg.vocab) do
      if type(t) ~= 'string' then fail('exact.model: vocab[%d] must be a string, got %s', i, type(t)) end
      m.vocab[i] = t
    end
  elseif type(cfg.E) == 'table' and cfg.E[1] == nil then
    m.vocab = {}
    for k in pairs(cfg.E) do m.vocab[#m.vocab + 1] = k end
    table.sort(m.vocab)
  else
    fail('exact.model: needs vocab, the token names in the order of E\'s rows')
  end
  m.index = {}
  for i, t in ipairs(m.vocab) do
    if m.index[t] then fail("exact.model: token '%s' appears twice in vocab", t) end
    m.index[t] = i
  end
  if type(cfg.E) ~= 'table' then fail('exact.model: E must be a matrix or a table {token = row}, got %s', type(cfg.E)) end
  if cfg.E[1] ~= nil then
    rows = cfg.E
  else
    for i, t in ipairs(m.vocab) do
      if cfg.E[t] == nil then fail("exact.model: E has no row for token '%s'", t) end
      rows[i] = cfg.E[t]
    end
    for k in pairs(cfg.E) do
      if not m.index[k] then fail("exact.model: E has a row for '%s', which is not in vocab", tostring(k)) end
    end
  end
  m.E = matrix('E', rows, #m.vocab, nil, #m.vocab .. ' tokens in vocab')
  m.d = #m.E[1]
  m.P = matrix('P', cfg.P, nil, m.d, nil, 'd = ' .. m.d .. ', the width of E')
  m.U = cfg.U and matrix('U', cfg.U, m.d, #m.vocab, 'd = ' .. m.d, #m.vocab .. ' tokens in vocab')
  m.blocks = {}
  if cfg.blocks then
    if type(cfg.blocks) ~= 'table' or #cfg.blocks == 0 then fail('exact.model: blocks must be a list of block tables') end
    for i, b in ipairs(cfg.blocks) do
      if type(b) ~= 'table' then fail('exact.model: blocks[%d] must be a table, got %s', i, type(b)) end
      m.blocks[i] = read_block(b, m.d, 'blocks[' .. i .. ']')
    end
  else
    local block = {}
    for _, k in ipairs(BLOCK_KEYS) do block[k] = cfg[k] end
    m.blocks[1] = read_block(block, m.d, 'the model')
  end
  return m
end

function Model:__tostring()
  return ('exact.model: vocabulary %d (%s), d = %d, %d position%s, %d block%s, %s unembedding'):format(
    #self.vocab, table.concat(self.vocab, ' '), self.d, #self.P, #self.P == 1 and '' or 's',
    #self.blocks, #self.blocks == 1 and '' or 's', self.U and 'separate' or 'tied')
end

function Model:trace(tokens) return exact.trace(self, tokens) end

-- ---- vector arithmetic ----------------------------------------------------------------

local add, sub, mul, div = V.add, V.sub, V.mul, V.div

local function vadd(a, b)
  local out = {}
  for i = 1, #a do out[i] = add(a[i], b[i]) end
  return out
end

-- x·W for a row vector x (+ bias)
local function vecmat(x, W, bias)
  local out = {}
  for j = 1, #W[1] do
    local s = bias and bias[j] or V.ZERO
    for i = 1, #x do
      if not (V.is_rational(W[i][j]) and W[i][j]:sign() == 0) then s = add(s, mul(x[i], W[i][j])) end
    end
    out[j] = s
  end
  return out
end

local function dot(a, b, from, to)
  local s = V.ZERO
  for i = from, to do s = add(s, mul(a[i], b[i])) end
  return s
end

-- exact.layer_norm(v, gamma, beta, eps) -> {mean, centered, var, std, out, note}
-- Population variance, std = √(var + eps). A zero std (var = eps = 0) is
-- exact 0 and the centered values, all 0, are not divided: out = beta. When
-- the centered values are one named value c times rationals r (always so in
-- two dimensions), var = c²·mean(r²) and out = sign(c)·r/√mean(r²), exact.
function exact.layer_norm(v, gamma, beta, eps)
  if type(v) ~= 'table' or #v == 0 then fail('exact.layer_norm: expected a non-empty vector (a table), got %s', type(v)) end
  local n = #v
  local x = {}
  for i = 1, n do x[i] = V.lift(v[i]) end
  gamma = gamma or const_vector(n, V.ONE)
  beta = beta or const_vector(n, V.ZERO)
  eps = V.lift(eps or 0)
  local r = {}
  local total = V.ZERO
  for i = 1, n do total = add(total, x[i]) end
  r.mean = div(total, n)
  r.centered = {}
  for i = 1, n do r.centered[i] = sub(x[i], r.mean) end
  local sq = V.ZERO
  for i = 1, n do sq = add(sq, mul(r.centered[i], r.centered[i])) end
  r.var = div(sq, n)
  local ve = add(r.var, eps)
  if V.is_rational(ve) and ve:sign() == 0 then
    r.std = V.ZERO
    r.out = {}
    for i = 1, n do r.out[i] = add(mul(gamma[i], r.centered[i]), beta[i]) end
    r.note = 'var = 0: std is exactly 0 and the centered values (all 0) are not divided'
    return r
  end
  r.std = V.sqrt(ve)
  -- centered = c·(r₁..rₙ) with rational rᵢ: divide exactly
  local ratios, base, bi
  if V.is_rational(eps) and eps:sign() == 0 and V.is_named(r.var) then
    for i = 1, n do
      if not (V.is_rational(r.centered[i]) and r.centered[i]:sign() == 0) then base, bi = r.centered[i], i; break end
    end
    local s = base and V.sign(base)
    if s then
      ratios = {}
      for i = 1, n do
        ratios[i] = div(r.centered[i], base)
        if not V.is_rational(ratios[i]) then ratios = nil; break end
      end
    end
    if ratios then
      local m2 = V.ZERO
      for i = 1, n do m2 = add(m2, mul(ratios[i], ratios[i])) end
      local root = V.sqrt(div(m2, n))
      r.out = {}
      for i = 1, n do r.out[i] = add(mul(gamma[i], div(mul(ratios[i], s), root)), beta[i]) end
      local shown = {}
      for i = 1, n do shown[i] = V.render(ratios[i]) end
      r.note = ('c = c%d·(%s), so σ = |c%d|·%s and the output is exact'):format(
        bi, table.concat(shown, ', '), bi, V.render(root))
      return r
    end
  end
  r.out = {}
  for i = 1, n do r.out[i] = add(mul(gamma[i], div(r.centered[i], r.std)), beta[i]) end
  return r
end

-- ---- the trace ---------------------------------------------------------------------------

local Trace = {}
Trace.__index = Trace
local Step = {}
Step.__index = Step

local function split_tokens(model, tokens)
  local list = {}
  if type(tokens) == 'string' then
    -- 'a b' splits at spaces; a string without spaces is one token if it is
    -- one, else one token per character ('ab')
    if tokens:find('%s') or model.index[tokens] then
      for t in tokens:gmatch('%S+') do list[#list + 1] = t end
    else
      for c in tokens:gmatch('.') do list[#list + 1] = c end
    end
  elseif type(tokens) == 'table' then
    for i, t in ipairs(tokens) do
      if type(t) == 'number' then
        if not model.vocab[t] then fail('exact.trace: token id %s at position %d is outside 1..%d', tostring(t), i, #model.vocab) end
        t = model.vocab[t]
      end
      list[i] = t
    end
  else
    fail("exact.trace: tokens must be a string ('a b') or a list, got %s", type(tokens))
  end
  if #list == 0 then fail('exact.trace: no tokens') end
  local ids = {}
  for i, t in ipairs(list) do
    ids[i] = model.index[t]
    if not ids[i] then
      fail("exact.trace: unknown token '%s' at position %d (vocabulary: %s)", tostring(t), i, table.concat(model.vocab, ', '))
    end
  end
  if #list > #model.P then
    fail('exact.trace: %d tokens, but P has rows for %d positions', #list, #model.P)
  end
  return list, ids
end

-- exact.trace(model, tokens) -> Trace: every step of the forward pass.
-- tokens: 'a b' (space-separated), 'ab' (one character each), or a list of names or ids.
function exact.trace(model, tokens)
  if getmetatable(model) ~= Model then fail('exact.trace: expected an exact.model, got %s', type(model)) end
  local list, ids = split_tokens(model, tokens)
  local T = #list
  local trace = setmetatable({model = model, tokens = list, ids = ids, steps = {}, cursor = 0}, Trace)
  local block_no
  local function record(name, formula, kind, values, extra)
    local s = setmetatable({index = #trace.steps + 1, name = name, formula = formula, kind = kind,
                            values = values, block = block_no}, Step)
    for k, v in pairs(extra or {}) do s[k] = v end
    trace.steps[#trace.steps + 1] = s
    return s
  end

  record('tokens', 'the input', 'tokens', list)
  local x = {}
  local embed = {}
  for i = 1, T do embed[i] = model.E[ids[i]] end
  record('embed', 'E[token]', 'vectors', embed)
  for i = 1, T do x[i] = vadd(embed[i], model.P[i]) end
  record('+pos', 'x = E[token] + P[position]', 'vectors', x)

  for b, blk in ipairs(model.blocks) do
    block_no = #model.blocks > 1 and b or nil
    local Qv, Kv, Vv = {}, {}, {}
    for i = 1, T do
      Qv[i] = vecmat(x[i], blk.Wq, blk.bq)
      Kv[i] = vecmat(x[i], blk.Wk, blk.bk)
      Vv[i] = vecmat(x[i], blk.Wv, blk.bv)
    end
    record('Q', 'Q = x·Wq' .. (blk.bq and ' + bq' or ''), 'vectors', Qv)
    record('K', 'K = x·Wk' .. (blk.bk and ' + bk' or ''), 'vectors', Kv)
    record('V', 'V = x·Wv' .. (blk.bv and ' + bv' or ''), 'vectors', Vv)
    local dh, dvh = #blk.Wq[1] / blk.heads, #blk.Wv[1] / blk.heads
    local attn = {}
    for i = 1, T do attn[i] = {} end
    for h = 1, blk.heads do
      local head = blk.heads > 1 and h or nil
      local scores, probs = {}, {}
      local scale_text = V.is_rational(blk.scale) and blk.scale == V.ONE and '' or V.render(blk.scale) .. '·'
      for i = 1, T do
        scores[i] = {}
        local last = blk.causal and i or T
        for j = 1, last do
          scores[i][j] = mul(blk.scale, dot(Qv[i], Kv[j], (h - 1) * dh + 1, h * dh))
        end
      end
      record('scores', 'S[i][j] = ' .. scale_text .. 'Q[i]·K[j]' .. (blk.causal and ', j ≤ i' or ''), 'rows', scores, {head = head})
      for i = 1, T do
        local e, total = {}, V.ZERO
        for j = 1, #scores[i] do
          e[j] = V.exp(scores[i][j])
          total = add(total, e[j])
        end
        probs[i] = {}
        for j = 1, #scores[i] do probs[i][j] = div(e[j], total) end
      end
      record('softmax', 'A = e^S / Σⱼ e^S (per row)', 'rows', probs, {head = head})
      for i = 1, T do
        for c = 1, dvh do
          local s = V.ZERO
          for j = 1, #probs[i] do s = add(s, mul(probs[i][j], Vv[j][(h - 1) * dvh + c])) end
          attn[i][(h - 1) * dvh + c] = s
        end
      end
    end
    record('attention', 'a = Σⱼ A[i][j]·V[j]', 'vectors', attn)
    if blk.Wo then
      local projected = {}
      for i = 1, T do projected[i] = vecmat(attn[i], blk.Wo, blk.bo) end
      attn = projected
      record('attention.out', 'a = a·Wo' .. (blk.bo and ' + bo' or ''), 'vectors', attn)
    end
    local function residual_norm(res_name, res_formula, base, delta, ln, ln_name)
      local r = {}
      for i = 1, T do r[i] = vadd(base[i], delta[i]) end
      record(res_name, res_formula, 'vectors', r)
      local parts = {}
      for i = 1, T do parts[i] = exact.layer_norm(r[i], ln.gamma, ln.beta, ln.eps) end
      local function field(f) local t = {} for i = 1, T do t[i] = parts[i][f] end return t end
      local notes = {}
      for i = 1, T do notes[i] = parts[i].note end
      record(ln_name .. '.mean', 'μ = mean(r)', 'scalars', field('mean'))
      record(ln_name .. '.centered', 'c = r − μ', 'vectors', field('centered'))
      record(ln_name .. '.var', 'σ² = mean(c²)', 'scalars', field('var'))
      record(ln_name .. '.std', ln.eps:sign() == 0 and 'σ = √σ²' or 'σ = √(σ² + ε)', 'scalars', field('std'))
      local plain = true
      for i = 1, #ln.gamma do
        if ln.gamma[i] ~= V.ONE or ln.beta[i]:sign() ~= 0 then plain = false end
      end
      record(ln_name .. '.out', plain and 'y = c/σ' or 'y = γ⊙c/σ + β', 'vectors', field('out'), {notes = notes})
      return field('out')
    end
    x = residual_norm('residual1', 'r = x + a', x, attn, blk.ln1, 'ln1')
    if blk.W1 then
      local hidden, act, out = {}, {}, {}
      for i = 1, T do
        hidden[i] = vecmat(x[i], blk.W1, blk.b1)
        act[i] = {}
        for j = 1, #hidden[i] do act[i][j] = blk.act == 'relu' and V.relu(hidden[i][j]) or hidden[i][j] end
        out[i] = vecmat(act[i], blk.W2, blk.b2)
      end
      record('mlp.hidden', 'h = x·W1' .. (blk.b1 and ' + b1' or ''), 'vectors', hidden)
      record('mlp.act', blk.act == 'relu' and 'ReLU(h)' or 'h (identity)', 'vectors', act)
      record('mlp.out', 'm = ReLU(h)·W2' .. (blk.b2 and ' + b2' or ''), 'vectors', out)
      x = residual_norm('residual2', 'r = x + m', x, out, blk.ln2, 'ln2')
    end
  end
  block_no = nil

  local logits = {}
  for i = 1, T do
    if model.U then
      logits[i] = vecmat(x[i], model.U)
    else
      logits[i] = {}
      for t = 1, #model.vocab do logits[i][t] = dot(x[i], model.E[t], 1, model.d) end
    end
  end
  record('logits', model.U and 'z = x·U' or 'z[t] = x·E[t] (tied)', 'vectors', logits)
  local choices, output = {}, {}
  for i = 1, T do
    choices[i] = exact.argmax(logits[i])
    output[i] = choices[i].index and model.vocab[choices[i].index] or '?'
  end
  record('argmax', 'the largest logit (certified)', 'argmax', choices)
  record('output', 'the predicted next token', 'tokens', output)
  trace.output = output
  return trace
end

-- exact.argmax(values) -> {index =, decided = true} or {decided = false, candidates = {...}}
-- Ties between provably equal values go to the first (as torch.argmax).
-- Named values are compared with certified bounds; where they cannot tell
-- two candidates apart the result is undecidable and lists them.
function exact.argmax(values)
  local best, undecided = 1, {}
  for j = 2, #values do
    local c = V.compare(values[j], values[best])
    if c == nil then
      undecided[#undecided + 1] = j
    elseif c > 0 then
      best = j
    end
  end
  -- a candidate left undecided earlier may now be provably below the best
  local open = {}
  for _, j in ipairs(undecided) do
    local c = V.compare(values[j], values[best])
    if c == nil or c > 0 then open[#open + 1] = j end
  end
  if #open == 0 then return {index = best, decided = true} end
  table.insert(open, 1, best)
  table.sort(open)
  return {decided = false, candidates = open}
end

-- ---- reading a trace -----------------------------------------------------------------------

-- trace:find(name, [block], [head]) -> the step (nil if none).
function Trace:find(name, block, head)
  for _, s in ipairs(self.steps) do
    if s.name == name and (block == nil or s.block == block or (block == 1 and s.block == nil)) and
       (head == nil or s.head == head or (head == 1 and s.head == nil)) then
      return s
    end
  end
end

-- trace:value(name, position, [i], [block]) -> the value (a rational or named).
function Trace:value(name, pos, i, block)
  local s = self:find(name, block)
  if not s then error(("trace:value: no step named '%s'"):format(tostring(name)), 2) end
  local v = s.values[pos]
  if i then v = v[i] end
  return v
end

local function each_value(s, fn)
  if s.kind == 'vectors' or s.kind == 'rows' then
    for pos, vec in ipairs(s.values) do
      for i, v in ipairs(vec) do fn(v, pos, i) end
    end
  elseif s.kind == 'scalars' then
    for pos, v in ipairs(s.values) do fn(v, pos) end
  end
end

-- step.register: 'named' if any of its values is named, else 'exact'.
function Step:register(pos)
  local named = false
  each_value(self, function(v, p) if (pos == nil or p == pos) and V.is_named(v) then named = true end end)
  return named and 'named' or 'exact'
end

function Step:key()
  return (self.block and ('block' .. self.block .. '.') or '') .. self.name .. (self.head and ('#' .. self.head) or '')
end

-- ---- printing ------------------------------------------------------------------------------

local LABEL_LIMIT = 32
local PREFIX = {sqrt = 'S', inv = 'D', exp = 'X', relu = 'R'}

-- Labels for long atoms, shared by all the steps of a trace so that an atom
-- is defined once, where it first appears.
local function labeller(trace, latex)
  local state = trace[latex and '_latex_labels' or '_labels']
  if not state then
    state = {names = {}, counts = {}, defined = {}}
    trace[latex and '_latex_labels' or '_labels'] = state
  end
  local ctx = {latex = latex}
  ctx.label = function(a) return state.names[a] end
  -- labels the long atoms of the values; returns the new definitions
  local function prepare(values)
    local set = {list = {}}
    for _, v in ipairs(values) do V.atoms(v, set) end
    table.sort(set.list, function(a, b) return a.id < b.id end)
    local defs = {}
    for _, a in ipairs(set.list) do
      if not state.names[a] then
        local text = V.atom_definition(a, ctx)
        if #text > LABEL_LIMIT then
          local p = PREFIX[a.kind]
          state.counts[p] = (state.counts[p] or 0) + 1
          state.names[a] = latex and (p .. '_{' .. state.counts[p] .. '}') or (p .. state.counts[p])
          defs[#defs + 1] = {name = state.names[a], text = text}
        end
      end
    end
    return defs
  end
  return ctx, prepare
end

local function values_list(s)
  local list = {}
  each_value(s, function(v) list[#list + 1] = v end)
  return list
end

-- pads to a width in characters (UTF-8), not bytes
local function pad(text, width)
  local n = #text:gsub('[\128-\191]', '')
  return n < width and text .. (' '):rep(width - n) or text
end

local function color(text, code, on) return on and ('\27[' .. code .. 'm' .. text .. '\27[0m') or text end

local function render_step(trace, s, opts)
  opts = opts or {}
  local ctx, prepare = labeller(trace, false)
  local defs = prepare(values_list(s))
  local out = {}
  local title = s.name .. (s.block and (' (block ' .. s.block .. ')') or '') .. (s.head and (' [head ' .. s.head .. ']') or '')
  local reg = (s.kind == 'tokens' or s.kind == 'argmax') and '' or s:register()
  out[#out + 1] = ('%3d  %s %s %s'):format(s.index, pad(title, 22), pad(s.formula, 30), reg)
  local hl = opts.highlight
  local function show(v)
    local text = V.render(v, ctx)
    if hl then text = color(text, V.is_named(v) and '33' or '32', true) end
    return text
  end
  local T = #trace.tokens
  for pos = 1, T do
    local head = ('       %d %-4s '):format(pos, trace.tokens[pos])
    local v = s.values[pos]
    local line
    if s.kind == 'tokens' then
      line = hl and color(v, '1', true) or v
    elseif s.kind == 'argmax' then
      if v.decided then
        line = ('%d (%s)'):format(v.index, trace.model.vocab[v.index])
      else
        local names = {}
        for _, j in ipairs(v.candidates) do names[#names + 1] = trace.model.vocab[j] end
        line = 'undecidable between ' .. table.concat(names, ', ') .. ' (their bounds overlap at 4096 bits)'
      end
      if hl then line = color(line, '1', true) end
    elseif s.kind == 'scalars' then
      line = show(v)
    else
      local parts = {}
      for i, x in ipairs(v) do parts[i] = show(x) end
      local open, close = '(', ')'
      if s.kind == 'rows' then open, close = '[', ']' end
      line = open .. table.concat(parts, ', ') .. close
      if #line > 110 and #parts > 1 then
        out[#out + 1] = head .. open
        for i, p in ipairs(parts) do out[#out + 1] = ('              %d: %s'):format(i, p) end
        line = nil
        out[#out + 1] = '              ' .. close
      end
    end
    if line then out[#out + 1] = head .. line end
    if s.notes and s.notes[pos] then out[#out + 1] = '              (' .. s.notes[pos] .. ')' end
  end
  for _, d in ipairs(defs) do out[#out + 1] = ('       where %s = %s'):format(d.name, d.text) end
  return table.concat(out, '\n')
end

function Trace:__tostring()
  local m = self.model
  local lines = {('exact trace of "%s": %d position%s, d = %d, %d block%s'):format(
    table.concat(self.tokens, ' '), #self.tokens, #self.tokens == 1 and '' or 's', m.d, #m.blocks, #m.blocks == 1 and '' or 's')}
  for _, s in ipairs(self.steps) do lines[#lines + 1] = render_step(self, s) end
  lines[#lines + 1] = ('output: %s'):format(table.concat(self.output, ' '))
  return table.concat(lines, '\n')
end

Step.__tostring = function(s) return s.name end

-- trace:step([k]): prints the next step (or step k) with its new values
-- highlighted and returns it; trace:reset() starts over.
function Trace:step(k)
  if k ~= nil then
    if type(k) ~= 'number' or k < 1 or k > #self.steps or k ~= math.floor(k) then
      error(('trace:step: step must be in 1..%d, got %s'):format(#self.steps, tostring(k)), 2)
    end
    self.cursor = k
  else
    if self.cursor >= #self.steps then
      print(('(end of the trace: %d steps; trace:reset() to start over)'):format(#self.steps))
      return nil
    end
    self.cursor = self.cursor + 1
  end
  local s = self.steps[self.cursor]
  local tty = torch._isatty(1)
  if self.cursor > 1 then
    local prev = self.steps[self.cursor - 1]
    print(color(('     after %d %s'):format(prev.index, prev.name), '2', tty))
  end
  print(render_step(self, s, {highlight = tty}))
  print(color(('     step %d of %d; trace:step() for the next'):format(self.cursor, #self.steps), '2', tty))
  return s
end

function Trace:reset() self.cursor = 0 end

-- trace:latex() -> the whole trace as a LaTeX fragment (align* environments).
function Trace:latex()
  local ctx, prepare = labeller(self, true)
  local out = {'% exact trace of "' .. table.concat(self.tokens, ' ') .. '"'}
  local function tex_name(s) return (s.name:gsub('_', '\\_'):gsub('%+', '{+}')) end
  for _, s in ipairs(self.steps) do
    local defs = prepare(values_list(s))
    out[#out + 1] = ('\\paragraph{%d. %s%s} (%s)'):format(s.index, tex_name(s),
      s.block and (' (block ' .. s.block .. ')') or '', (s.kind == 'tokens' or s.kind == 'argmax') and 'tokens' or s:register())
    out[#out + 1] = '\\begin{align*}'
    local rows = {}
    for pos = 1, #self.tokens do
      local v = s.values[pos]
      local body
      if s.kind == 'tokens' then
        body = '\\texttt{' .. v .. '}'
      elseif s.kind == 'argmax' then
        body = v.decided and ('%d\\ (\\texttt{%s})'):format(v.index, self.model.vocab[v.index]) or '\\text{undecidable}'
      elseif s.kind == 'scalars' then
        body = V.render(v, ctx)
      else
        local parts = {}
        for i, x in ipairs(v) do parts[i] = V.render(x, ctx) end
        body = '\\left(' .. table.concat(parts, ',\\ ') .. '\\right)'
      end
      rows[#rows + 1] = ('\\text{%d (\\texttt{%s})} &: %s'):format(pos, self.tokens[pos], body)
    end
    for _, d in ipairs(defs) do rows[#rows + 1] = ('\\text{where } %s &= %s'):format(d.name, d.text) end
    out[#out + 1] = table.concat(rows, ' \\\\\n')
    out[#out + 1] = '\\end{align*}'
  end
  return table.concat(out, '\n')
end

-- ---- the float forward, for checking ----------------------------------------------------------

local function tensor(m) 
  local rows = {}
  for i, row in ipairs(m) do
    rows[i] = {}
    for j, v in ipairs(row) do rows[i][j] = V.tonumber(v) end
  end
  return torch.tensor(rows, {dtype = 'float64'})
end

local function vtensor(v)
  local t = {}
  for i, x in ipairs(v) do t[i] = V.tonumber(x) end
  return torch.tensor(t, {dtype = 'float64'})
end

-- exact.float_forward(model, tokens) -> {[step key] = float64 tensor}: the same
-- forward pass with LibTorch's float64 kernels (matmul, softmax, var, sqrt),
-- for checking the trace (trace:compare).
function exact.float_forward(model, tokens)
  local _, ids = split_tokens(model, tokens)
  local T = #ids
  local out = {}
  local E = tensor(model.E)
  local index = torch.tensor(ids, {dtype = 'int64'})
  local emb = E:index_select(1, index)
  out.embed = emb
  local x = emb + tensor(model.P):narrow(1, 1, T)
  out['+pos'] = x
  for b, blk in ipairs(model.blocks) do
    local prefix = #model.blocks > 1 and ('block' .. b .. '.') or ''
    local function lin(input, W, bias)
      local y = input:matmul(tensor(W))
      if bias then y = y + vtensor(bias) end
      return y
    end
    local q, k, v = lin(x, blk.Wq, blk.bq), lin(x, blk.Wk, blk.bk), lin(x, blk.Wv, blk.bv)
    out[prefix .. 'Q'], out[prefix .. 'K'], out[prefix .. 'V'] = q, k, v
    local dh, dvh = q:size(2) / blk.heads, v:size(2) / blk.heads
    local heads = {}
    for h = 1, blk.heads do
      local qh, kh, vh = q:narrow(2, (h - 1) * dh + 1, dh), k:narrow(2, (h - 1) * dh + 1, dh), v:narrow(2, (h - 1) * dvh + 1, dvh)
      local s = qh:matmul(kh:t()) * V.tonumber(blk.scale)
      if blk.causal then
        local mask = torch.ones(T, T, {dtype = 'bool'}):triu(1)
        s = s:masked_fill(mask, -math.huge)
      end
      local p = s:softmax(2)
      local suffix = blk.heads > 1 and ('#' .. h) or ''
      out[prefix .. 'scores' .. suffix], out[prefix .. 'softmax' .. suffix] = s, p
      heads[h] = p:matmul(vh)
    end
    local a = torch.cat(heads, 2)
    out[prefix .. 'attention'] = a
    if blk.Wo then
      a = lin(a, blk.Wo, blk.bo)
      out[prefix .. 'attention.out'] = a
    end
    local function norm(r, ln, name)
      local mean = r:mean(2, true)
      local c = r - mean
      local var = (c * c):mean(2, true)
      local std = (var + V.tonumber(ln.eps)):sqrt()
      -- a zero std leaves the centered values undivided, as the exact trace does
      local safe = torch.where(std:eq(0), torch.ones_like(std), std)
      local y = c / safe * vtensor(ln.gamma) + vtensor(ln.beta)
      out[prefix .. name .. '.mean'], out[prefix .. name .. '.centered'] = mean:squeeze(2), c
      out[prefix .. name .. '.var'], out[prefix .. name .. '.std'], out[prefix .. name .. '.out'] = var:squeeze(2), std:squeeze(2), y
      return y
    end
    local r = x + a
    out[prefix .. 'residual1'] = r
    x = norm(r, blk.ln1, 'ln1')
    if blk.W1 then
      local h = lin(x, blk.W1, blk.b1)
      local act = blk.act == 'relu' and h:relu() or h
      local m = lin(act, blk.W2, blk.b2)
      out[prefix .. 'mlp.hidden'], out[prefix .. 'mlp.act'], out[prefix .. 'mlp.out'] = h, act, m
      r = x + m
      out[prefix .. 'residual2'] = r
      x = norm(r, blk.ln2, 'ln2')
    end
  end
  out.logits = model.U and x:matmul(tensor(model.U)) or x:matmul(E:t())
  return out
end

-- trace:compare(floats) -> largest |exact − float| over every value of every
-- step that has a float counterpart, the number of values compared, and the
-- step where the difference is largest.
function Trace:compare(floats)
  floats = floats or exact.float_forward(self.model, self.tokens)
  local worst, count, where_worst = 0, 0, nil
  for _, s in ipairs(self.steps) do
    local key = s:key()
    local t = floats[key]
    if t then
      each_value(s, function(v, pos, i)
        local f = i and t[pos][i]:item() or t[pos]:item()
        local d = math.abs(V.tonumber(v) - f)
        if d ~= d then d = math.huge end
        count = count + 1
        if d > worst or where_worst == nil then
          if d >= worst then worst, where_worst = d, ('%s at position %d%s'):format(key, pos, i and (', entry ' .. i) or '') end
        end
      end)
    end
  end
  return worst, count, where_worst
end

return exact
