-- How exact values print: a rational, or a named value's sum of terms
-- c·e^q·Πaᵏ, as text (√(2/3), e^1/(e^1+e^2)) or as LaTeX, with long atoms
-- replaced by labels where the caller names them. value.lua holds the
-- algebra; this file only reads its terms (t.c, t.e, t.f = {{a, k}}) and
-- atoms (a.kind, a.arg).
local native = require('anatomy.torch.native').exact
local newQ, isQ = native.new, native.is_rational

local R = {}

-- ctx: {latex = bool, label = function(atom) -> name or nil}

local render

local function rational_text(q, latex)
  if not latex or q:is_integer() then return tostring(q) end
  local sign = q:sign() < 0 and '-' or ''
  return ('%s\\frac{%s}{%s}'):format(sign, tostring(q:abs():num()), q:den())
end

local function exponent_text(q, latex)
  if latex then return '{' .. rational_text(q, true) .. '}' end
  if q:is_integer() and q:sign() >= 0 then return tostring(q) end
  return '(' .. tostring(q) .. ')'
end

-- The text of an atom as a factor: √2, √(2/3), (e^1+e^2), e^(...), ReLU(...).
local function atom_text(a, ctx)
  local name = ctx.label and ctx.label(a)
  if name then return name end
  local inner = render(a.arg, ctx)
  if ctx.latex then
    if a.kind == 'sqrt' then return '\\sqrt{' .. inner .. '}' end
    if a.kind == 'inv' then return '\\left(' .. inner .. '\\right)', inner end
    if a.kind == 'exp' then return 'e^{' .. inner .. '}' end
    return '\\operatorname{ReLU}\\left(' .. inner .. '\\right)'
  end
  if a.kind == 'sqrt' then
    if isQ(a.arg) and a.arg:is_integer() then return '√' .. inner end
    return '√(' .. inner .. ')'
  end
  if a.kind == 'inv' then return '(' .. inner .. ')' end
  if a.kind == 'exp' then return 'e^(' .. inner .. ')' end
  return 'ReLU(' .. inner .. ')'
end

local function power_text(base, k, ctx)
  if k == 1 then return base end
  if ctx.latex then return '{' .. base .. '}^{' .. k .. '}' end
  return base .. '^' .. k
end

local function term_text(t, ctx)
  local latex = ctx.latex
  local num, den = {}, {}
  local c = t.c:abs()
  if c:den() ~= '1' then den[#den + 1] = c:den() end
  if t.e:sign() > 0 then num[#num + 1] = 'e^' .. exponent_text(t.e, latex)
  elseif t.e:sign() < 0 then den[#den + 1] = 'e^' .. exponent_text(-t.e, latex) end
  local bare  -- LaTeX: a lone 1/(sum) needs no parentheses inside \frac
  for _, p in ipairs(t.f) do
    local base, inner = atom_text(p.a, ctx)
    if p.k > 0 then num[#num + 1] = power_text(base, p.k, ctx)
    else
      den[#den + 1] = power_text(base, -p.k, ctx)
      if inner and p.k == -1 then bare = inner end
    end
  end
  local cn = c:num()
  if cn ~= '1' or #num == 0 then table.insert(num, 1, cn) end
  local sep = latex and ' \\cdot ' or '·'
  local text = table.concat(num, sep)
  if #den > 0 then
    if latex then
      text = '\\frac{' .. text .. '}{' .. (#den == 1 and bare or table.concat(den, sep)) .. '}'
    elseif #den == 1 then
      text = text .. '/' .. den[1]
    else
      text = text .. '/(' .. table.concat(den, sep) .. ')'
    end
  end
  return (t.c:sign() < 0 and '-' or '') .. text
end

-- R.render(v, ctx): the exact form as text (or LaTeX with ctx.latex).
function render(v, ctx)
  ctx = ctx or {}
  if type(v) == 'number' then v = newQ(v) end
  if isQ(v) then return rational_text(v, ctx.latex) end
  local parts = {}
  for i, t in ipairs(v.terms) do
    local s = term_text(t, ctx)
    if i > 1 and s:sub(1, 1) ~= '-' then s = '+' .. s end
    parts[i] = s
  end
  return table.concat(parts)
end
R.render = render
R.rational_text = rational_text

-- The text of an atom's definition, for "where S1 = √(...)".
function R.atom_definition(a, ctx)
  if a.kind == 'inv' then return render(a.arg, ctx) end
  local saved = ctx.label
  ctx.label = function(b) if b ~= a then return saved and saved(b) end end
  local text = atom_text(a, ctx)
  ctx.label = saved
  return text
end

return R
