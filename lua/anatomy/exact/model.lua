-- exact.model: reading a tiny transformer's weights (integers and fraction
-- strings) into exact values, with errors that name the weight, the entry and
-- where an expected size comes from; and reading the tokens a trace runs on.
local native = require('anatomy.torch.native')
local V = require('anatomy.exact.value')
local options = require('anatomy.torch.options')

local M = {}

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
M.fail = fail

-- ---- reading weights --------------------------------------------------------------

local function number(path, x)
  if V.is_rational(x) then return x end
  if type(x) == 'number' then
    if x ~= math.floor(x) or x ~= x then
      local hint = native.exact.suggest(x)
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

M.const_vector = const_vector

local BLOCK_KEYS = {'Wq', 'Wk', 'Wv', 'Wo', 'bq', 'bk', 'bv', 'bo', 'heads', 'scale', 'causal',
  'W1', 'b1', 'act', 'W2', 'b2', 'gamma', 'beta', 'ln1', 'ln2', 'eps'}
local MODEL_KEYS = {'vocab', 'E', 'P', 'U', 'blocks'}

local function check_keys(cfg, allowed, what)
  local k, names = options.unknown(cfg, allowed)
  if k then fail("exact.model: unknown key '%s' in %s (expected %s)", k, what, names) end
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
M.Model = Model

-- exact.model{vocab=, E=, P=, Wq=, Wk=, Wv=, [Wo=], W1=, W2=, [act='relu'],
--   [gamma=, beta=, eps=0 | ln1=, ln2=], [scale=1 | 'sqrt'], [heads=1], [causal=true],
--   [U=]} — one block from the top-level fields, or blocks = {{Wq=...}, ...}.
function M.model(cfg)
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

-- m:trace(tokens) -> exact.trace(m, tokens)
function Model:trace(tokens)
  local t = require('anatomy.exact').trace(self, tokens)  -- lazy: exact/init.lua requires this file
  return t
end

function Model:__tostring()
  return ('exact.model: vocabulary %d (%s), d = %d, %d position%s, %d block%s, %s unembedding'):format(
    #self.vocab, table.concat(self.vocab, ' '), self.d, #self.P, #self.P == 1 and '' or 's',
    #self.blocks, #self.blocks == 1 and '' or 's', self.U and 'separate' or 'tied')
end

-- M.split_tokens(model, tokens) -> names, ids (errors for unknown tokens)
function M.split_tokens(model, tokens)
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

return M
