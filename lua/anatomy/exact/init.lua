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
local V = require('anatomy.exact.value')
local walk = require('anatomy.exact.walk')
local show = require('anatomy.exact.show')
local check = require('anatomy.exact.check')

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

local M = require('anatomy.exact.model')
local fail, split_tokens, Model, const_vector = M.fail, M.split_tokens, M.Model, M.const_vector

-- exact.model{vocab=, E=, P=, Wq=, Wk=, Wv=, ...}: see exact/model.lua
exact.model = M.model

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


-- Adds a step to the trace: its name, formula, kind and values (in the
-- block being traced, if any).
function Trace:record(name, formula, kind, values, extra)
  local s = setmetatable({index = #self.steps + 1, name = name, formula = formula, kind = kind,
                          values = values, block = self.block}, Step)
  for k, v in pairs(extra or {}) do s[k] = v end
  self.steps[#self.steps + 1] = s
  return s
end

-- One block's attention: Q, K, V, then per head the scores, the softmax and
-- the weighted values, then the output projection. Returns a (T vectors).
local function trace_attention(trace, blk, x, T)
  local Qv, Kv, Vv = {}, {}, {}
  for i = 1, T do
    Qv[i] = vecmat(x[i], blk.Wq, blk.bq)
    Kv[i] = vecmat(x[i], blk.Wk, blk.bk)
    Vv[i] = vecmat(x[i], blk.Wv, blk.bv)
  end
  trace:record('Q', 'Q = x·Wq' .. (blk.bq and ' + bq' or ''), 'vectors', Qv)
  trace:record('K', 'K = x·Wk' .. (blk.bk and ' + bk' or ''), 'vectors', Kv)
  trace:record('V', 'V = x·Wv' .. (blk.bv and ' + bv' or ''), 'vectors', Vv)
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
    trace:record('scores', 'S[i][j] = ' .. scale_text .. 'Q[i]·K[j]' .. (blk.causal and ', j ≤ i' or ''), 'rows', scores, {head = head})
    for i = 1, T do
      local e, total = {}, V.ZERO
      for j = 1, #scores[i] do
        e[j] = V.exp(scores[i][j])
        total = add(total, e[j])
      end
      probs[i] = {}
      for j = 1, #scores[i] do probs[i][j] = div(e[j], total) end
    end
    trace:record('softmax', 'A = e^S / Σⱼ e^S (per row)', 'rows', probs, {head = head})
    for i = 1, T do
      for c = 1, dvh do
        local sum = V.ZERO
        for j = 1, #probs[i] do sum = add(sum, mul(probs[i][j], Vv[j][(h - 1) * dvh + c])) end
        attn[i][(h - 1) * dvh + c] = sum
      end
    end
  end
  trace:record('attention', 'a = Σⱼ A[i][j]·V[j]', 'vectors', attn)
  if blk.Wo then
    local projected = {}
    for i = 1, T do projected[i] = vecmat(attn[i], blk.Wo, blk.bo) end
    attn = projected
    trace:record('attention.out', 'a = a·Wo' .. (blk.bo and ' + bo' or ''), 'vectors', attn)
  end
  return attn
end

-- The residual r = base + delta, then the layer norm of r step by step.
-- Returns the norm's output (T vectors).
local function trace_residual_norm(trace, T, res_name, res_formula, base, delta, ln, ln_name)
  local r = {}
  for i = 1, T do r[i] = vadd(base[i], delta[i]) end
  trace:record(res_name, res_formula, 'vectors', r)
  local parts = {}
  for i = 1, T do parts[i] = exact.layer_norm(r[i], ln.gamma, ln.beta, ln.eps) end
  local function field(f) local t = {} for i = 1, T do t[i] = parts[i][f] end return t end
  local notes = {}
  for i = 1, T do notes[i] = parts[i].note end
  trace:record(ln_name .. '.mean', 'μ = mean(r)', 'scalars', field('mean'))
  trace:record(ln_name .. '.centered', 'c = r − μ', 'vectors', field('centered'))
  trace:record(ln_name .. '.var', 'σ² = mean(c²)', 'scalars', field('var'))
  trace:record(ln_name .. '.std', ln.eps:sign() == 0 and 'σ = √σ²' or 'σ = √(σ² + ε)', 'scalars', field('std'))
  local plain = true
  for i = 1, #ln.gamma do
    if ln.gamma[i] ~= V.ONE or ln.beta[i]:sign() ~= 0 then plain = false end
  end
  trace:record(ln_name .. '.out', plain and 'y = c/σ' or 'y = γ⊙c/σ + β', 'vectors', field('out'), {notes = notes})
  return field('out')
end

-- One block's MLP: hidden, activation, output (T vectors).
local function trace_mlp(trace, blk, x, T)
  local hidden, act, out = {}, {}, {}
  for i = 1, T do
    hidden[i] = vecmat(x[i], blk.W1, blk.b1)
    act[i] = {}
    for j = 1, #hidden[i] do act[i][j] = blk.act == 'relu' and V.relu(hidden[i][j]) or hidden[i][j] end
    out[i] = vecmat(act[i], blk.W2, blk.b2)
  end
  trace:record('mlp.hidden', 'h = x·W1' .. (blk.b1 and ' + b1' or ''), 'vectors', hidden)
  trace:record('mlp.act', blk.act == 'relu' and 'ReLU(h)' or 'h (identity)', 'vectors', act)
  trace:record('mlp.out', 'm = ReLU(h)·W2' .. (blk.b2 and ' + b2' or ''), 'vectors', out)
  return out
end

-- The logits (untied U, or tied to E), the certified argmax and the output tokens.
local function trace_readout(trace, model, x, T)
  local logits = {}
  for i = 1, T do
    if model.U then
      logits[i] = vecmat(x[i], model.U)
    else
      logits[i] = {}
      for t = 1, #model.vocab do logits[i][t] = dot(x[i], model.E[t], 1, model.d) end
    end
  end
  trace:record('logits', model.U and 'z = x·U' or 'z[t] = x·E[t] (tied)', 'vectors', logits)
  local choices, output = {}, {}
  for i = 1, T do
    choices[i] = exact.argmax(logits[i])
    output[i] = choices[i].index and model.vocab[choices[i].index] or '?'
  end
  trace:record('argmax', 'the largest logit (certified)', 'argmax', choices)
  trace:record('output', 'the predicted next token', 'tokens', output)
  return output
end

-- exact.trace(model, tokens) -> Trace: every step of the forward pass.
-- tokens: 'a b' (space-separated), 'ab' (one character each), or a list of names or ids.
function exact.trace(model, tokens)
  if getmetatable(model) ~= Model then fail('exact.trace: expected an exact.model, got %s', type(model)) end
  local list, ids = split_tokens(model, tokens)
  local T = #list
  local trace = setmetatable({model = model, tokens = list, ids = ids, steps = {}, cursor = 0}, Trace)
  trace:record('tokens', 'the input', 'tokens', list)
  local x = {}
  local embed = {}
  for i = 1, T do embed[i] = model.E[ids[i]] end
  trace:record('embed', 'E[token]', 'vectors', embed)
  for i = 1, T do x[i] = vadd(embed[i], model.P[i]) end
  trace:record('+pos', 'x = E[token] + P[position]', 'vectors', x)
  for b, blk in ipairs(model.blocks) do
    trace.block = #model.blocks > 1 and b or nil
    local attn = trace_attention(trace, blk, x, T)
    x = trace_residual_norm(trace, T, 'residual1', 'r = x + a', x, attn, blk.ln1, 'ln1')
    if blk.W1 then
      x = trace_residual_norm(trace, T, 'residual2', 'r = x + m', x, trace_mlp(trace, blk, x, T), blk.ln2, 'ln2')
    end
  end
  trace.block = nil
  trace.output = trace_readout(trace, model, x, T)
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

-- step.register: 'named' if any of its values is named, else 'exact'.
function Step:register(pos)
  local named = false
  walk.each_value(self, function(v, p) if (pos == nil or p == pos) and V.is_named(v) then named = true end end)
  return named and 'named' or 'exact'
end

function Step:key()
  return (self.block and ('block' .. self.block .. '.') or '') .. self.name .. (self.head and ('#' .. self.head) or '')
end

-- Printing, stepping and LaTeX (exact/show.lua).
Trace.__tostring, Step.__tostring = show.trace, show.step_name
Trace.step, Trace.reset, Trace.latex = show.step, show.reset, show.latex

-- The float check (exact/check.lua).
exact.float_forward = check.float_forward
Trace.compare = check.compare

return exact
