-- Exact values for the exact trace: rationals (GMP, from natives.exact) and
-- named values, the expressions that appear once an operation leaves the
-- rationals (e^1/(e^1+e^2), √(2/3)).
--
-- A named value is kept in one normal form: a sum of terms c·e^q·Πaᵏ with a
-- rational coefficient c, a rational exponent q of e, and atoms a raised to
-- integer powers. Atoms are what cannot be expanded further:
--   sqrt(v)  √v of a rational that is not a square, or of a named value (k = ±1)
--   inv(P)   1/P of a sum P of several terms (k < 0 only; positive powers expand)
--   exp(v)   e^v of a named v
--   relu(v)  ReLU(v) of a named v whose sign the bounds could not decide
-- Atoms are interned, so equal expressions are the same table and a key
-- string decides equality. Simplifications follow from the form: e^a·e^b =
-- e^(a+b), √r·√r = r, x/x = 1, terms over a common 1/P whose numerators add
-- up to a multiple of P collapse (e^1/(e^1+e^2) + e^2/(e^1+e^2) = 1), a sum
-- with one constant term is that rational.
--
-- Every named value has a float64 value (V.tonumber) and certified bounds
-- (V.bounds): intervals with dyadic endpoints, rounded outward at each step.
-- Signs and comparisons of named values are decided from the bounds, at
-- increasing precision, or reported as undecidable.
local natives = require('anatomy.torch.native')
local native = require('anatomy.torch.native').exact
local newQ, isQ = native.new, native.is_rational
local B = require('anatomy.exact.bounds')

local V = {}
local ZERO, ONE = newQ(0), newQ(1)
V.ZERO, V.ONE = ZERO, ONE

local Named = {}
Named.__index = Named
V.Named = Named

-- exact.is_named(v) -> whether v is a named value of the exact trace (a Named: a value with its name and history)
local function is_named(v) return getmetatable(v) == Named end
V.is_named = is_named
V.is_rational = isQ

-- V.Q(x): a rational from an integer, a string 'p/q' or a rational.
function V.Q(x) return newQ(x) end

-- A rational or named value from anything that stands for one.
local function lift(x)
  if isQ(x) or is_named(x) then return x end
  return newQ(x)
end
V.lift = lift

-- ---- atoms -----------------------------------------------------------------

local atoms = setmetatable({}, {__mode = 'v'})  -- interned by key
local next_atom_id = 0

local function key_of(v) return isQ(v) and tostring(v) or v.key end

local function intern(kind, arg)
  local key = kind .. '(' .. key_of(arg) .. ')'
  local a = atoms[key]
  if not a then
    next_atom_id = next_atom_id + 1
    a = {kind = kind, arg = arg, key = key, id = next_atom_id, bounds = {}}
    atoms[key] = a
  end
  return a
end

-- ---- terms -----------------------------------------------------------------
-- term = {c = rational, e = rational, f = {{a = atom, k = int}, ...} sorted by atom id, mk = monomial key}

local function term(c, e, f)
  local parts = {tostring(e)}
  for i = 1, #f do parts[i + 1] = f[i].a.id .. '^' .. f[i].k end
  return {c = c, e = e, f = f, mk = table.concat(parts, ';')}
end

local function term_less(x, y)
  if #x.f ~= #y.f then return #x.f < #y.f end
  for i = 1, #x.f do
    local a, b = x.f[i], y.f[i]
    if a.a.id ~= b.a.id then return a.a.id < b.a.id end
    if a.k ~= b.k then return a.k > b.k end
  end
  return x.e < y.e
end

local function terms_of(v)
  if isQ(v) then return {term(v, ZERO, {})} end
  return v.terms
end

local collapse  -- defined below (needs mul and div)

-- A value from a list of terms: like terms added, zeros dropped, sorted;
-- a lone constant term is its rational.
local function from_terms(list, no_collapse)
  local acc, order = {}, {}
  for _, t in ipairs(list) do
    local s = acc[t.mk]
    if s then
      s.c = s.c + t.c
    else
      acc[t.mk] = {c = t.c, e = t.e, f = t.f, mk = t.mk}
      order[#order + 1] = t.mk
    end
  end
  local out = {}
  for _, mk in ipairs(order) do
    local t = acc[mk]
    if t.c:sign() ~= 0 then out[#out + 1] = t end
  end
  if not no_collapse then out = collapse(out) end
  table.sort(out, term_less)
  if #out == 0 then return ZERO end
  if #out == 1 and #out[1].f == 0 and out[1].e:sign() == 0 then return out[1].c end
  local parts = {}
  for i, t in ipairs(out) do parts[i] = tostring(t.c) .. '*' .. t.mk end
  return setmetatable({terms = out, key = table.concat(parts, '+')}, Named)
end

local add, mul, div, pow

-- The product of two terms, reduced: √-powers beyond ±1 and positive powers
-- of inv atoms are multiplied out (which may expand into several terms).
local function mul_terms(x, y)
  local c, e = x.c * y.c, x.e + y.e
  local powers, list = {}, {}
  for _, side in ipairs{x.f, y.f} do
    for _, p in ipairs(side) do
      local entry = powers[p.a]
      if entry then
        entry.k = entry.k + p.k
      else
        entry = {a = p.a, k = p.k}
        powers[p.a] = entry
        list[#list + 1] = entry
      end
    end
  end
  local kept, extra = {}, {}
  for _, p in ipairs(list) do
    local a, k = p.a, p.k
    if k ~= 0 then
      if a.kind == 'sqrt' and (k >= 2 or k <= -2) then
        local m = k >= 0 and math.floor(k / 2) or -math.floor(-k / 2)  -- toward zero: 1/√x stays 1/√x
        if isQ(a.arg) then c = c * a.arg ^ m else extra[#extra + 1] = pow(a.arg, m) end
        if k - 2 * m ~= 0 then kept[#kept + 1] = {a = a, k = k - 2 * m} end
      elseif a.kind == 'inv' and k > 0 then
        extra[#extra + 1] = pow(a.arg, k)
      else
        kept[#kept + 1] = {a = a, k = k}
      end
    end
  end
  table.sort(kept, function(p, q) return p.a.id < q.a.id end)
  local result = from_terms({term(c, e, kept)}, true)
  for _, v in ipairs(extra) do result = mul(result, v) end
  return result
end

function add(a, b)
  a, b = lift(a), lift(b)
  if isQ(a) and isQ(b) then return a + b end
  local list = {}
  for _, t in ipairs(terms_of(a)) do list[#list + 1] = t end
  for _, t in ipairs(terms_of(b)) do list[#list + 1] = t end
  return from_terms(list)
end

local function scale_terms(v, c)
  local list = {}
  for _, t in ipairs(terms_of(v)) do list[#list + 1] = term(t.c * c, t.e, t.f) end
  return list
end

local function neg(a)
  a = lift(a)
  if isQ(a) then return -a end
  return from_terms(scale_terms(a, newQ(-1)), true)
end

local function sub(a, b) return add(a, neg(b)) end

function mul(a, b)
  a, b = lift(a), lift(b)
  if isQ(a) and isQ(b) then return a * b end
  if isQ(a) and a:sign() == 0 or isQ(b) and b:sign() == 0 then return ZERO end
  if isQ(b) then return from_terms(scale_terms(a, b), true) end
  if isQ(a) then return from_terms(scale_terms(b, a), true) end
  local list = {}
  for _, x in ipairs(a.terms) do
    for _, y in ipairs(b.terms) do
      for _, t in ipairs(terms_of(mul_terms(x, y))) do list[#list + 1] = t end
    end
  end
  return from_terms(list)
end

function pow(v, n)
  v = lift(v)
  if isQ(v) then
    if n < 0 and v:sign() == 0 then error('division by zero', 0) end
    return v ^ n
  end
  if n == 0 then return ONE end
  if n < 0 then return div(ONE, pow(v, -n)) end
  local r = v
  for _ = 2, n do r = mul(r, v) end
  return r
end

-- m with a = m·b for a one-term m, or nil.
local function proportion(a, b)
  if isQ(a) or isQ(b) or #a.terms ~= #b.terms then return nil end
  local b1 = b.terms[1]
  local inv1 = {}
  for i, p in ipairs(b1.f) do inv1[i] = {a = p.a, k = -p.k} end
  for _, t in ipairs(a.terms) do
    local m = mul_terms(t, term(ONE / b1.c, -b1.e, inv1))
    if isQ(m) or #m.terms == 1 then
      local candidate = mul(m, b)
      if key_of(candidate) == a.key then return m end
    end
  end
  return nil
end

function div(a, b)
  a, b = lift(a), lift(b)
  if isQ(b) then
    if b:sign() == 0 then error('division by zero', 0) end
    return mul(a, ONE / b)
  end
  if is_named(a) and a.key == b.key then return ONE end
  if #b.terms == 1 then
    local t = b.terms[1]
    local f = {}
    for i, p in ipairs(t.f) do f[i] = {a = p.a, k = -p.k} end
    local inverse = setmetatable({terms = {term(ONE / t.c, -t.e, f)}, key = '?'}, Named)
    local list = {}
    for _, x in ipairs(terms_of(a)) do
      for _, y in ipairs(terms_of(mul_terms(x, inverse.terms[1]))) do list[#list + 1] = y end
    end
    return from_terms(list)
  end
  local m = proportion(a, b)
  if m then return m end
  -- 1/b for a sum b: an inv atom of b scaled so that its first coefficient is 1.
  local c0 = b.terms[1].c
  local monic = from_terms(scale_terms(b, ONE / c0), true)
  local inv = from_terms({term(ONE / c0, ZERO, {{a = intern('inv', monic), k = -1}})}, true)
  return mul(a, inv)
end

-- Terms sharing a factor 1/P whose numerators add up to m·P become m.
function collapse(list)
  local seen = {}
  for _, t in ipairs(list) do
    for _, p in ipairs(t.f) do
      if p.a.kind == 'inv' and p.k == -1 and not seen[p.a] then seen[p.a] = true; seen[#seen + 1] = p.a end
    end
  end
  for _, atom in ipairs(seen) do
    local group, rest = {}, {}
    for _, t in ipairs(list) do
      local hit
      for i, p in ipairs(t.f) do if p.a == atom and p.k == -1 then hit = i end end
      if hit then
        local f = {}
        for i, p in ipairs(t.f) do if i ~= hit then f[#f + 1] = p end end
        group[#group + 1] = term(t.c, t.e, f)
      else
        rest[#rest + 1] = t
      end
    end
    if #group >= #atom.arg.terms then
      local m = proportion(from_terms(group, true), atom.arg)
      if m then
        for _, t in ipairs(terms_of(m)) do rest[#rest + 1] = t end
        local merged = from_terms(rest, true)
        return collapse(isQ(merged) and (merged:sign() == 0 and {} or {term(merged, ZERO, {})}) or merged.terms)
      end
    end
  end
  return list
end

V.add, V.sub, V.mul, V.div, V.neg, V.pow = add, sub, mul, div, neg, pow

local function atom_value(kind, arg)
  return from_terms({term(ONE, ZERO, {{a = intern(kind, arg), k = 1}})}, true)
end

-- ---- numbers and bounds (exact/bounds.lua) ------------------------------------

local tonumber_value = B.tonumber
V.tonumber = B.tonumber
V.bounds = B.bounds

-- V.sign(v) -> -1, 0 or 1; nil and the widest interval tried when the bounds
-- cannot decide (a named value that is 0 without simplifying to 0, or is too
-- close to 0 for 4096 bits).
function V.sign(v)
  return B.sign(lift(v))
end

-- V.compare(a, b) -> -1, 0, 1 (a < b, =, >), or nil when undecidable.
function V.compare(a, b) return V.sign(sub(a, b)) end

-- ---- functions that leave the rationals ---------------------------------------

-- V.sqrt(v): exact when v is the square of a rational (√(9/4) = 3/2) or of a
-- one-term named value; else the atom √v.
function V.sqrt(v)
  v = lift(v)
  if isQ(v) then
    local s = v:sign()
    if s < 0 then error(('square root of a negative number (%s)'):format(tostring(v)), 0) end
    if s == 0 then return ZERO end
    return v:sqrt() or atom_value('sqrt', v)
  end
  if #v.terms == 1 then
    local t = v.terms[1]
    local root = t.c:sign() > 0 and t.c:sqrt()
    local even = true
    for _, p in ipairs(t.f) do if p.k % 2 ~= 0 then even = false end end
    if root and even then
      local f = {}
      for i, p in ipairs(t.f) do f[i] = {a = p.a, k = p.k / 2} end
      return from_terms({term(root, t.e / 2, f)}, true)
    end
  end
  if V.sign(v) == -1 then error(('square root of a negative value (%s ≈ %.6g)'):format(V.render(v), tonumber_value(v)), 0) end
  return atom_value('sqrt', v)
end

-- V.exp(v): e^q for a rational q (e^0 = 1), else the atom e^(v).
function V.exp(v)
  v = lift(v)
  if isQ(v) then
    if v:sign() == 0 then return ONE end
    return from_terms({term(ONE, v, {})}, true)
  end
  return atom_value('exp', v)
end

-- V.relu(v): v or 0 when its sign is decided, else the atom ReLU(v).
function V.relu(v)
  v = lift(v)
  local s = V.sign(v)
  if s == nil then return atom_value('relu', v) end
  return s > 0 and v or ZERO
end

-- ---- rendering (render.lua) ---------------------------------------------------

local R = require('anatomy.exact.render')
local render = R.render
V.render = render
V.atom_definition = R.atom_definition

-- V.atoms(v, out): the atoms v is built from, inner ones included (a set and a list).
function V.atoms(v, out)
  out = out or {list = {}}
  if is_named(v) then
    for _, t in ipairs(v.terms) do
      for _, p in ipairs(t.f) do
        if not out[p.a] then
          V.atoms(p.a.arg, out)
          out[p.a] = true
          out.list[#out.list + 1] = p.a
        end
      end
    end
  end
  return out
end

-- ---- the named value's metatable --------------------------------------------

Named.__add = add
Named.__sub = sub
Named.__mul = mul
Named.__div = div
Named.__unm = neg
Named.__pow = pow
Named.__tostring = function(v) return render(v) end
Named.__eq = function(a, b) return a.key == b.key end
function Named:tonumber() return tonumber_value(self) end
function Named:latex() return render(self, {latex = true}) end

-- Rationals mixed with named values: a rational's arithmetic falls back to V's
-- when the other operand is named (Lua asks the left operand first).
do
  local meta = debug.getregistry()['anatomy.Rational']
  for name, fn in pairs{__add = add, __sub = sub, __mul = mul, __div = div} do
    local rational = meta[name]
    meta[name] = function(a, b)
      if is_named(a) or is_named(b) then return fn(a, b) end
      return rational(a, b)
    end
  end
  meta.__index.latex = function(q) return R.rational_text(q, true) end
end

return V
