-- The exact trace: a tiny transformer's forward pass in exact arithmetic.
--
--   anatomy examples/exact_trace.lua
--
-- Vocabulary a, b, c in two dimensions; one post-norm block with identity
-- attention and MLP weights; LayerNorm without epsilon; unembedding tied to E.
-- Every value is a fraction until the softmax at position 2 leaves the
-- rationals: from there values are named (e^1/(e^1+e^2)), still exact.
-- The same weights then run through LibTorch in float64, and every exact or
-- named value is compared with its float.
local model = exact.model{
  vocab = {'a', 'b', 'c'},
  E = {a = {1, 0}, b = {0, 1}, c = {1, 1}},
  P = {{0, 0}, {1, 0}},
  Wq = 'I', Wk = 'I', Wv = 'I',   -- one head, no output projection, score scale 1
  W1 = 'I', act = 'relu', W2 = 'I',
  gamma = {1, 1}, beta = {0, 0},  -- eps = 0
}
print(model)
print()

local trace = exact.trace(model, 'a b')
print(trace)

-- LayerNorm's square root, on its own.
for _, v in ipairs{{1, 2, 3}, {2, 2, 2}} do
  local ln = exact.layer_norm(v)
  local function vec(t) local s = {} for i, x in ipairs(t) do s[i] = exact.tostring(x) end return '(' .. table.concat(s, ', ') .. ')' end
  print(('\nLayerNorm%s: mean %s, centered %s, var %s, std %s (%s), output %s%s'):format(
    vec(v), exact.tostring(ln.mean), vec(ln.centered), exact.tostring(ln.var), exact.tostring(ln.std),
    exact.register(ln.std), vec(ln.out), ln.note and ('\n  ' .. ln.note) or ''))
end

local worst, count, where = trace:compare()
print(('\nagainst LibTorch float64 on the same weights: %d values, largest difference %.3g (%s)'):format(count, worst, where))
print('\nLaTeX of the softmax step:')
print(trace:latex():match('\\paragraph{%d+%. softmax}.-\\end{align%*}'))
