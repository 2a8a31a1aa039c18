-- bounds: the float64 value of an exact value and its certified bounds —
-- interval arithmetic on rationals, rounded outward at increasing precision
-- (64 to 4096 bits) — from which signs and comparisons are decided, or said
-- to be undecidable. Over value.lua's normal form (terms c·e^q·Πaᵏ of atoms).
local native = require('anatomy.torch.native').exact
local isQ = native.is_rational
local ZERO, ONE = native.new(0), native.new(1)
local B = {}

local tonumber_value

local function atom_number(a)
  if a.number == nil then
    local x = tonumber_value(a.arg)
    if a.kind == 'sqrt' then a.number = math.sqrt(x)
    elseif a.kind == 'inv' then a.number = x  -- the sum P; its power is negative
    elseif a.kind == 'exp' then a.number = math.exp(x)
    else a.number = math.max(0, x) end
  end
  return a.number
end

-- exact.tonumber(v): the float64 value.
function tonumber_value(v)
  if type(v) == 'number' then return v end
  if isQ(v) then return v:tonumber() end
  local s = 0
  for _, t in ipairs(v.terms) do
    local x = t.c:tonumber() * (t.e:sign() == 0 and 1 or math.exp(t.e:tonumber()))
    for _, p in ipairs(t.f) do x = x * atom_number(p.a) ^ p.k end
    s = s + x
  end
  return s
end
B.tonumber = tonumber_value

-- Interval arithmetic on rationals, rounded outward to `w` bits. nil: the
-- bounds at this precision cannot exclude a division by zero.
local function iv_mul(a, b, c, d, w)
  local p1, p2, p3, p4 = a * c, a * d, b * c, b * d
  local lo, hi = p1, p1
  for _, p in ipairs{p2, p3, p4} do
    if p < lo then lo = p end
    if hi < p then hi = p end
  end
  return lo:floor(w), hi:ceil(w)
end

local function iv_inv(a, b, w)
  if a:sign() <= 0 and b:sign() >= 0 then return nil end
  return (ONE / b):floor(w), (ONE / a):ceil(w)
end

local bounds

local function atom_bounds(a, w)
  local cached = a.bounds[w]
  if cached then return cached[1], cached[2] end
  local lo, hi = bounds(a.arg, w)
  if not lo then return nil end
  if a.kind == 'sqrt' then
    if hi:sign() < 0 then return nil end
    lo, hi = native.sqrt_bounds(lo, hi, w)
  elseif a.kind == 'inv' then
    -- the bounds of the sum P itself; the term's negative power inverts them
  elseif a.kind == 'exp' then
    lo = native.exp_bounds(lo, w)
    hi = select(2, native.exp_bounds(hi, w))
  else
    if lo:sign() < 0 then lo = ZERO end
    if hi:sign() < 0 then hi = ZERO end
  end
  a.bounds[w] = {lo, hi}
  return lo, hi
end

-- exact.bounds(v, bits) -> lo, hi (rationals) with lo ≤ v ≤ hi, or nil.
function bounds(v, w)
  if isQ(v) then return v, v end
  local slo, shi = ZERO, ZERO
  for _, t in ipairs(v.terms) do
    local lo, hi = t.c, t.c
    if t.e:sign() ~= 0 then
      local elo, ehi = native.exp_bounds(t.e, w)
      lo, hi = iv_mul(lo, hi, elo, ehi, w)
    end
    for _, p in ipairs(t.f) do
      local alo, ahi = atom_bounds(p.a, w)
      if not alo then return nil end
      if p.k < 0 then
        alo, ahi = iv_inv(alo, ahi, w)
        if not alo then return nil end
      end
      for _ = 1, math.abs(p.k) do lo, hi = iv_mul(lo, hi, alo, ahi, w) end
    end
    slo, shi = slo + lo, shi + hi
  end
  return slo, shi
end
B.bounds = bounds

local PRECISIONS = {64, 256, 1024, 4096}

-- bounds.sign(v) -> -1, 0 or 1 for a rational or named value; nil and the
-- widest interval tried when the bounds cannot decide.
function B.sign(v)
  if isQ(v) then return v:sign() end
  local lo, hi
  for _, w in ipairs(PRECISIONS) do
    lo, hi = bounds(v, w)
    if lo then
      if lo:sign() > 0 then return 1 end
      if hi:sign() < 0 then return -1 end
    end
  end
  return nil, lo, hi
end

return B
