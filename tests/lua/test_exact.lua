-- The exact trace: rationals (GMP), named values, the reference example's
-- every value, agreement with LibTorch's float64 forward, and the errors.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local native = require('anatomy.torch.native')
local test, eq, raises = H.test, H.eq, H.raises
local Q, S = exact.Q, exact.tostring

-- v is the rational `want` ('3/2'): as a string of its exact form and as a rational
local function is_q(v, want, what)
  if not exact.is_rational(v) then error(('%s: expected the rational %s, got the named value %s'):format(what, want, S(v)), 2) end
  if S(v) ~= want then error(('%s: expected %s, got %s'):format(what, want, S(v)), 2) end
  if not (v == Q(want)) then error(('%s: %s ~= Q(%s)'):format(what, S(v), want), 2) end
end

local function is_vec(vec, want, what)
  eq(#vec, #want, what .. ' length')
  for i = 1, #want do is_q(vec[i], want[i], ('%s[%d]'):format(what, i)) end
end

-- Each case {step, want, what} of the trace t at `position`: want a list is a
-- vector (is_vec), a string a rational (is_q)
local function expect_values(t, position, cases)
  for _, c in ipairs(cases) do
    local v = t:find(c[1]).values[position]
    if type(c[2]) == 'table' then is_vec(v, c[2], c[3]) else is_q(v, c[2], c[3]) end
  end
end

local function reference()
  return exact.model{
    vocab = {'a', 'b', 'c'},
    E = {a = {1, 0}, b = {0, 1}, c = {1, 1}},
    P = {{0, 0}, {1, 0}},
    Wq = 'I', Wk = 'I', Wv = 'I',
    W1 = 'I', act = 'relu', W2 = 'I',
    gamma = {1, 1}, beta = {0, 0},
  }
end

test('rationals: GMP integers of any size, canonical fractions, exact square roots', function()
  local big = Q(2) ^ 200
  eq(S(big), '1606938044258990275541962092341162602522202993782792835301376')
  eq(S(big / (big + 1) * (big + 1) / big), '1')
  eq(S(Q'6/4'), '3/2')
  eq(S(Q' -10 / 4 '), '-5/2')
  eq(S(Q'1/3' + Q'1/6'), '1/2')
  is_q(Q'9/4':sqrt(), '3/2', '√(9/4)')
  eq(Q(2):sqrt(), nil, '√2 is not rational')
  eq(Q'1/3' < Q'1/2', true)
  eq(Q'-7/3':tonumber(), -7 / 3)
  raises(function() return Q(1) / 0 end, ": division by zero")
end)

test('weights: integers and fraction strings; a float is refused with the fraction it means', function()
  raises(function() Q(0.1) end, "(expected an integer or a fraction written as a string, got 0.1 (write '1/10' for an exact fraction))")
  raises(function() Q'1/0' end, "('1/0' has a zero denominator)")
  raises(function() Q'1.5' end, "('1.5' is not an integer or a fraction p/q)")
  local cfg = {vocab = {'a'}, E = {{1, 0}}, P = {{0, 0}}, Wq = {{0.1, 0}, {0, 1}}, Wk = 'I', Wv = 'I'}
  raises(function() exact.model(cfg) end, "exact.model: Wq[1][1] = 0.1 is not exact; write fractions as strings, e.g. '1/10'")
  cfg.Wq = {{'1/3', 0}, {0, 1}}
  cfg.Wk = {{0.25, 0}, {0, 1}}
  raises(function() exact.model(cfg) end, "exact.model: Wk[1][1] = 0.25 is not exact; write fractions as strings, e.g. '1/4'")
  cfg.Wk = 'I'
  eq(S(exact.model(cfg).blocks[1].Wq[1][1]), '1/3')
end)

test('named values: the obvious simplifications', function()
  local e1, e2 = exact.exp(1), exact.exp(2)
  is_q(exact.exp(0), '1', 'e^0')
  is_q(e1 / e1, '1', 'a one-entry softmax')
  is_q(e1 / (e1 + e1), '1/2', 'e^1/(e^1+e^1)')
  is_q(e1 / (e1 + e2) + e2 / (e1 + e2), '1', 'a softmax row sums to 1')
  eq(S(e1 * e2), 'e^3')
  is_q(exact.sqrt(Q'9/4'), '3/2', '√(9/4)')
  is_q(exact.sqrt(Q'2/3') * exact.sqrt(Q'2/3'), '2/3', '√(2/3)²')
  eq(S(exact.sqrt(Q'2/3')), '√(2/3)')
  eq(S(exact.sqrt(2)), '√2')
  eq(S(Q(-1) / exact.sqrt(Q'2/3')), '-1/√(2/3)')
  eq(exact.register(exact.sqrt(Q'2/3')), 'named')
  eq(exact.latex(e1 / (e1 + e2)), '\\frac{e^{1}}{e^{1}+e^{2}}')
  eq(exact.latex(exact.sqrt(Q'2/3')), '\\sqrt{\\frac{2}{3}}')
end)

test('certified bounds decide signs and comparisons, or say undecidable', function()
  local lo, hi = exact.bounds(exact.exp(1), 64)
  eq(lo <= hi, true)
  eq(lo:tonumber() <= math.exp(1) and math.exp(1) <= hi:tonumber(), true, 'e inside its bounds')
  eq((hi - lo) < Q(2) ^ -60, true, 'width below 2^-60')
  for k = -15, 15 do
    local q = Q(k) / 3
    local l, h = native.exact.exp_bounds(q, 80)
    local f = math.exp(q:tonumber())
    eq(l:tonumber() <= f * (1 + 1e-15) and f * (1 - 1e-15) <= h:tonumber(), true, 'e^(' .. S(q) .. ') inside its bounds')
    eq((h - l) / l < Q(2) ^ -75, true, 'e^(' .. S(q) .. '): relative width below 2^-75')
  end
  local lo2, hi2 = native.exact.exp_bounds(Q(-30), 100)
  eq(lo2:tonumber() <= math.exp(-30) * (1 + 1e-15) and math.exp(-30) * (1 - 1e-15) <= hi2:tonumber(), true, 'e^-30')
  local s_lo, s_hi = native.exact.sqrt_bounds(Q(2), Q(2), 80)
  eq(s_lo * s_lo <= Q(2) and Q(2) <= s_hi * s_hi, true, '√2 bounded')
  local e1, e2 = exact.exp(1), exact.exp(2)
  local p1, p2 = e1 / (e1 + e2), e2 / (e1 + e2)
  eq(exact.compare(p1, p2), -1)
  eq(exact.compare(p2, p1), 1)
  eq(exact.compare(p1, p1), 0)
  eq(exact.sign(p1 - Q'1/2'), -1)
  is_q(exact.relu(p1 - Q'1/2'), '0', 'ReLU of a certified negative')
  eq(S(exact.relu(p2 - Q'1/2')), '-1/2+e^2/(e^1+e^2)')
  -- √2·√3 = √6, but the normal form keeps two atoms: the bounds cannot tell
  local a, b = exact.sqrt(2) * exact.sqrt(3), exact.sqrt(6)
  eq(exact.compare(a, b), nil, 'undecidable')
  local r = exact.argmax{Q(1), a, b}
  eq(r.decided, false)
  eq(r.candidates, {2, 3})
  local r2 = exact.argmax{p1, p2, Q'1/2'}
  eq(r2.decided, true)
  eq(r2.index, 2)
  eq(S(exact.relu(a - b)), 'ReLU(-√6+√2·√3)', 'an undecidable ReLU stays symbolic')
end)

test('the reference example, position 1 (a): exact all the way', function()
  local t = exact.trace(reference(), 'a b')
  local function v(name) return t:find(name).values[1] end
  expect_values(t, 1, {
    {'+pos', {'1', '0'}, 'x'}, {'Q', {'1', '0'}, 'Q'}, {'K', {'1', '0'}, 'K'}, {'V', {'1', '0'}, 'V'},
    {'scores', {'1'}, 'S'}, {'softmax', {'1'}, 'softmax'}, {'attention', {'1', '0'}, 'attn'},
    {'residual1', {'2', '0'}, 'residual1'},
    {'ln1.mean', '1', 'ln1 mean'}, {'ln1.centered', {'1', '-1'}, 'ln1 centered'}, {'ln1.var', '1', 'ln1 var'},
    {'ln1.std', '1', 'ln1 std'}, {'ln1.out', {'1', '-1'}, 'ln1 out'},
    {'mlp.act', {'1', '0'}, 'ReLU'}, {'mlp.out', {'1', '0'}, 'mlp'}, {'residual2', {'2', '-1'}, 'residual2'},
    {'ln2.mean', '1/2', 'ln2 mean'}, {'ln2.centered', {'3/2', '-3/2'}, 'ln2 centered'}, {'ln2.var', '9/4', 'ln2 var'},
    {'ln2.std', '3/2', 'ln2 std'}, {'ln2.out', {'1', '-1'}, 'ln2 out'},
    {'logits', {'1', '-1', '0'}, 'logits a, b, c'},
  })
  eq(v('argmax').index, 1)
  eq(v('output'), 'a')
  for _, s in ipairs(t.steps) do
    if s.kind ~= 'tokens' and s.kind ~= 'argmax' then eq(s:register(1), 'exact', s.name .. ' at position 1') end
  end
end)

test('the reference example, position 2 (b): named at the softmax', function()
  local t = exact.trace(reference(), 'a b')
  local function v(name) return t:find(name).values[2] end
  expect_values(t, 2, {{'+pos', {'1', '1'}, 'x'}, {'Q', {'1', '1'}, 'Q'}})
  expect_values(t, 1, {{'K', {'1', '0'}, 'K at position 1'}})
  expect_values(t, 2, {{'K', {'1', '1'}, 'K'}, {'scores', {'1', '2'}, 'scores'}})
  local p = v('softmax')
  eq({S(p[1]), S(p[2])}, {'e^1/(e^1+e^2)', 'e^2/(e^1+e^2)'})
  eq({exact.register(p[1]), exact.register(p[2])}, {'named', 'named'})
  eq(t:find('scores'):register(2), 'exact')
  eq(t:find('softmax'):register(2), 'named')
  for _, name in ipairs{'attention', 'residual1', 'ln1.mean', 'ln1.centered', 'ln1.var', 'ln1.std'} do
    eq(t:find(name):register(2), 'named', name .. ' at position 2')
  end
  eq(S(v('attention')[2]), 'e^2/(e^1+e^2)')
  is_q(v('attention')[1], '1', 'attn[1]: the weights sum to exactly 1')
  eq(S(v('ln1.mean')), '3/2+e^2/(2·(e^1+e^2))')
  -- in two dimensions LayerNorm's output is ±(1, -1) whatever the input: proven, so exact again
  is_vec(v('ln1.out'), {'1', '-1'}, 'ln1 out')
  is_vec(v('logits'), {'1', '-1', '0'}, 'logits')
  eq(t.output, {'a', 'a'})
end)

test('LayerNorm: √ named in general, exact for squares, zero variance not divided', function()
  local ln = exact.layer_norm{1, 2, 3}
  is_q(ln.mean, '2', 'mean')
  is_vec(ln.centered, {'-1', '0', '1'}, 'centered')
  is_q(ln.var, '2/3', 'var')
  eq(S(ln.std), '√(2/3)')
  eq(exact.register(ln.std), 'named')
  eq({S(ln.out[1]), S(ln.out[2]), S(ln.out[3])}, {'-1/√(2/3)', '0', '1/√(2/3)'})
  local z = exact.layer_norm{2, 2, 2}
  is_q(z.mean, '2', 'mean')
  is_vec(z.centered, {'0', '0', '0'}, 'centered')
  is_q(z.var, '0', 'var')
  is_q(z.std, '0', 'std')
  is_vec(z.out, {'0', '0', '0'}, 'out')
  eq(z.note ~= nil, true, 'the trace says it did not divide')
  local s = exact.layer_norm{Q'1/2', 2}
  is_q(s.var, '9/16', 'var')
  is_q(s.std, '3/4', '√(9/16)')
end)

test('every exact and named value matches LibTorch float64 within 1e-12', function()
  local t = exact.trace(reference(), 'a b')
  local worst, count = t:compare()
  eq(count >= 80, true, 'values compared: ' .. count)
  eq(worst <= 1e-12, true, ('largest difference %.3g'):format(worst))
  -- and a model off the easy path: d = 3, fractions, biases, two heads, an output
  -- projection, eps, gamma/beta, three positions
  local m = exact.model{
    vocab = {'x', 'y', 'z', 'w'},
    E = {{1, 0, '1/2'}, {0, 1, -1}, {'1/3', 1, 1}, {2, -1, 0}},
    P = {{0, 0, 0}, {1, 0, 0}, {0, '1/2', 1}},
    Wq = {{1, 0, 1, 0}, {0, 1, 0, 1}, {1, 1, 0, 0}}, Wk = {{1, 0, 0, 1}, {0, 1, 1, 0}, {0, 0, 1, 1}},
    Wv = {{1, 0, 1, 0}, {0, 1, 0, 1}, {'1/2', 0, 0, 1}}, Wo = {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}, {1, 1, 1}},
    heads = 2, bq = {0, '1/2', 0, 0}, scale = 'sqrt',
    W1 = {{1, -1}, {0, 1}, {1, 0}}, b1 = {'-1/2', 0}, W2 = {{1, 0, -1}, {0, 2, 1}},
    ln1 = {gamma = {1, 2, 1}, beta = {0, '1/2', 0}, eps = '1/100'}, ln2 = {gamma = {1, 1, 1}, beta = {0, 0, 0}},
    U = {{1, 0, 0, 1}, {0, 1, 0, -1}, {0, 0, 1, '1/2'}},
  }
  local t2 = exact.trace(m, 'x y w')
  local worst2, count2, where2 = t2:compare()
  eq(count2 >= 150, true, 'values compared: ' .. count2)
  eq(worst2 <= 1e-12, true, ('largest difference %.3g at %s'):format(worst2, where2))
  eq(t2:find('softmax', 1, 2) ~= nil, true, 'one softmax step per head')
  eq(t2:find('ln2.std'):register(), 'named')
end)

test('shapes and tokens: clear errors', function()
  local base = {vocab = {'a', 'b', 'c'}, E = {a = {1, 0}, b = {0, 1}, c = {1, 1}}, P = {{0, 0}, {1, 0}},
                Wq = 'I', Wk = 'I', Wv = 'I', W1 = 'I', W2 = 'I'}
  local function with(k, v)  -- base with k set to v (nil: k left out)
    local t = H.merged(base, {})
    t[k] = v
    return t
  end
  raises(function() exact.model(with('Wq', {{1, 0, 0}, {0, 1}})) end, 'exact.model: Wq[2] has 2 entries, expected 3 (as Wq[1])')
  raises(function() exact.model(with('Wk', {{1, 0, 0}, {0, 1, 0}})) end, 'exact.model: Wk[1] has 3 entries, expected 2 (the width of Wq)')
  raises(function() exact.model(with('Wq', {{1, 0}})) end, 'exact.model: Wq has 1 rows, expected 2 (rows = d = 2, the width of E)')
  raises(function() exact.model(with('P', {{0, 0, 0}})) end, 'exact.model: P[1] has 3 entries, expected 2 (d = 2, the width of E)')
  raises(function() exact.model(with('gamma', {1, 2, 3})) end, 'exact.model: ln1.gamma has 3 entries, expected 2 (d, the width of E)')
  raises(function() exact.model(with('W2', nil)) end, 'exact.model: the model has W1 without W2')
  raises(function() exact.model(with('act', 'gelu')) end, "exact.model: act must be 'relu' or 'identity', got 'gelu'")
  raises(function() exact.model(with('Wv', {{1, 0, 0}, {0, 1, 0}})) end,
    'exact.model: Wv is 2×3, so an output projection Wo (3×2) is needed to return to d = 2')
  raises(function() exact.model(with('Wk', {{1, 0}, {0, 'x'}})) end, "exact.model: Wk[2][2]: 'x' is not an integer or a fraction p/q")
  local m = exact.model(base)
  raises(function() exact.trace(m, 'a d') end, "exact.trace: unknown token 'd' at position 2 (vocabulary: a, b, c)")
  raises(function() exact.trace(m, 'a b c') end, 'exact.trace: 3 tokens, but P has rows for 2 positions')
  raises(function() exact.trace(m, {1, 4}) end, 'exact.trace: token id 4 at position 2 is outside 1..3')
  raises(function() exact.trace({}, 'a') end, 'exact.trace: expected an exact.model, got table')
  raises(function() exact.layer_norm{} end, 'exact.layer_norm: expected a non-empty vector (a table), got table')
  eq(exact.trace(m, 'ab').tokens, {'a', 'b'}, 'one token per character')
  eq(exact.trace(m, {1, 2}).tokens, {'a', 'b'}, 'token ids')
end)

test('print, step by step, and LaTeX', function()
  local t = exact.trace(reference(), 'a b')
  local text = tostring(t)
  eq(text:find('[e^1/(e^1+e^2), e^2/(e^1+e^2)]', 1, true) ~= nil, true, 'the softmax row in print(trace)')
  eq(text:find('output: a a', 1, true) ~= nil, true)
  local names = {}
  local saved = print
  print = function() end  -- luacheck: ignore
  local ok, err = pcall(function()
    for _ = 1, #t.steps do names[#names + 1] = t:step().name end
    eq(t:step(), nil, 'past the end')
    t:reset()
    eq(t:step().name, 'tokens')
    eq(t:step(8).name, 'softmax')
  end)
  print = saved  -- luacheck: ignore
  assert(ok, err)
  eq({names[1], names[2], names[3], names[4], names[7], names[8], names[9], names[10], names[11], names[15]},
     {'tokens', 'embed', '+pos', 'Q', 'scores', 'softmax', 'attention', 'residual1', 'ln1.mean', 'ln1.out'})
  eq(names[#names], 'output')
  eq(names[#names - 1], 'argmax')
  raises(function() t:step(99) end, 'trace:step: step must be in 1..27, got 99')
  local tex = t:latex()
  eq(tex:find('\\frac{e^{1}}{e^{1}+e^{2}}', 1, true) ~= nil, true, 'the softmax in LaTeX')
  eq(tex:find('\\frac{9}{4}', 1, true) ~= nil, true, 'ln2 var in LaTeX')
end)

-- An exact computation that grows without bound: squaring a rational in a
-- loop doubles its size each time until GMP aborts on its allocation.
test('an exact value growing past the size limit is an error, not an abort', function()
  local R = native.exact
  raises(function() local q = R.new('3/2'); for _ = 1, 64 do q = q * q end end,
    'the result would be an exact value of about 2.168e+07 bits, past the limit of 16777216 bits (numerator and denominator): the computation grows without bound')
  local limit = ' bits, past the limit of 16777216 bits (numerator and denominator): the computation grows without bound'
  raises(function() return (R.new('3/2') ^ 20000) ^ 65536 end, 'q ^ n would be an exact value of about 3.388e+09' .. limit)
  raises(function() return R.exp_bounds(R.new(2) ^ 5000, 64) end, 'e^q would be an exact value of an astronomical number of' .. limit)
  raises(function() return R.new(('9'):rep(6000000)) end, 'a fraction of 6000000 characters is past the limit of 16777216 bits an exact value may have)')
  eq(tostring(R.new('3/2') * 2), '3')
end)

-- lua_api under UBSan: the fraction suggested for a number that is not an
-- integer converted 1e308 to long long (undefined), and the convergents'
-- products could leave its range.
test('the fraction suggested for a number stays in range, and is nil when none comes close', function()
  local R = native.exact
  eq(R.suggest(1e308), nil)
  eq(R.suggest(1e-300), nil)
  eq(R.suggest(0.1), '1/10')
  eq(R.suggest(-2.5), '-5/2')
  raises(function() return R.new(0.1) end, "bad argument #1 to 'exact.new' (expected an integer or a fraction written as a string, got 0.1 (write '1/10' for an exact fraction))")
end)

H.done()
