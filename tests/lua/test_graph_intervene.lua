-- sae.intervene, g:ablate and g:steer: interventions on transcoder features
-- that rerun the model, as circuit-tracer's feature_intervention. With no
-- intervention the logits are the model's own, bit for bit; with every
-- layer constrained (MLP outputs and norm divisors held) and the attention
-- frozen the model is linear in what a feature writes, so ablating an active
-- feature changes each later feature's pre-activation and each logit (less
-- the mean logit) by exactly minus the graph's edge from it, and steering it
-- to v is (v - a) / (-a) times that; handles are gone after an error; bad
-- inputs are errors naming the argument. circuit-tracer's own numbers:
-- tests/parity/test_graph_intervene_parity.py.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, close, raises, raises_part = H.test, H.eq, H.close, H.raises, H.raises_part

local T, L = 6, 3
local ids = {1, 5, 9, 2, 17, 9}

local function family(kind) return H.tiny_lm(kind, kind == 'gpt2' and 1 or 2) end

local function transcoders(kind, seed, set)
  return H.randomize_transcoders(sae.clt{n_layers = L, d_model = 16, d_transcoder = 10, kind = kind,
    cross_layer = not set, skip = set or nil, input_hook = 'mlp.hook_in', output_hook = 'mlp.hook_out'}, seed)
end

local function clean_logits(model)
  return torch.no_grad(function() return model(torch.tensor(ids):long():view(1, T)) end)[1]:float()
end

local ALL = {constrained_layers = {1, 2, 3}}
local PRE = {constrained_layers = {1, 2, 3}, apply_activation_function = false}

for _, case in ipairs{{'gpt2', 'relu'}, {'gpt2', 'jumprelu'}, {'llama', 'jumprelu'}, {'llama', 'relu', true}} do
  local kind, tkind, set = case[1], case[2], case[3]
  local label = ('%s, a %s %s'):format(kind, tkind, set and 'per-layer set with W_skip' or 'CLT')
  test(label .. ': no intervention gives the clean logits exactly, and the graph\'s activations', function()
    local model = family(kind)
    local c = transcoders(tkind, 7, set)
    local g = sae.attribute(model, c, ids, {max_n_logits = 4, desired_logit_prob = 0.99})
    for _, opts in ipairs{{}, ALL, {freeze_attention = false}} do
      local r = sae.intervene(model, c, ids, {}, opts)
      H.identical(r.logits, clean_logits(model), label .. ': no intervention')
      eq(r.activations:size(), {L, T, 10}, 'activations (L, T, F)')
      local a = g.active_features
      local got = {}
      for i = 1, a:size(1) do got[i] = r.activations[a[i][1]:item()][a[i][2]:item()][a[i][3]:item()]:item() end
      close(torch.tensor(got):cpu(), g.activation_values:cpu(), 1e-6, 'the active features\' activations are the graph\'s')
      eq(r.activations:ne(0):sum():item(), a:size(1), 'and no others are active')
    end
    -- one ablated feature, every later layer free: the logits move (not a test that cannot fail)
    local r = g:ablate({1})
    eq((r.logits - clean_logits(model)):abs():max():item() > 1e-4, true, 'ablating a feature changes the logits')
    close(r.before, g.logit_probabilities, 0, 'before: the graph\'s probabilities')
  end)

  test(label .. ': constrained and frozen, an ablation moves each target by minus its edge', function()
    local model = family(kind)
    local c = transcoders(tkind, 8, set)
    local g = sae.attribute(model, c, ids, {max_n_logits = 4, desired_logit_prob = 0.99})
    local A, n, K = g.adjacency_matrix, g.active_features:size(1), g.logit_tokens:size(1)
    local N = A:size(1)
    local clean = sae.intervene(model, c, ids, {}, {apply_activation_function = false})
    local worst_f, worst_l, checked = 0, 0, 0
    for s = 1, n, math.max(1, math.floor(n / 12)) do
      local pre = g:ablate({s}, PRE)
      local post = g:ablate({s}, ALL)
      -- features: the change in pre-activation is minus the edge
      local d = pre.activations - clean.activations
      for t = 1, n do
        local l, p, f = g.active_features[t][1]:item(), g.active_features[t][2]:item(), g.active_features[t][3]:item()
        worst_f = math.max(worst_f, math.abs(d[l][p][f]:item() + A[t][s]:item()))
      end
      -- logits: the change at the last position, less its mean, is minus the edge into each logit node
      local dl = post.logits[T] - clean.logits[T]
      dl = dl - dl:mean()
      for k = 1, K do
        worst_l = math.max(worst_l, math.abs(dl[g.logit_tokens[k]:item()]:item() + A[N - K + k][s]:item()))
      end
      checked = checked + 1
    end
    eq(worst_f < 1e-5, true, ('feature edges: largest difference %.2e'):format(worst_f))
    eq(worst_l < 1e-5, true, ('logit edges: largest difference %.2e'):format(worst_l))
    print(('  %d ablations of %d features: feature edges within %.2e, logit edges within %.2e'):format(checked, n, worst_f, worst_l))
    -- steering is linear there too: to 3a is -2 times the ablation, and scale = 3 is value = 3a
    local s = n
    local a = g.activation_values[s]:item()
    local l, p, f = g.active_features[s][1]:item(), g.active_features[s][2]:item(), g.active_features[s][3]:item()
    local ablated = g:ablate({{l, p, f}}, ALL)
    local up = g:steer({{l, p, f, scale = 3}}, ALL)
    local up_v = g:steer({{layer = l, pos = p, feature = f, value = 3 * a}}, ALL)
    H.identical(up.logits, up_v.logits, 'scale 3 against value 3a')
    local lin = ((up.logits - clean.logits) - (ablated.logits - clean.logits) * -2):abs():max():item()
    eq(lin < 1e-4, true, ('steering to 3a is -2 times the ablation: largest difference %.2e'):format(lin))
    print(('  steering to 3a against -2 times the ablation (a change up to %.2f): %.2e'):format(
      (up.logits - clean.logits):abs():max():item(), lin))
    eq(tostring(up):find('steer 1 feature', 1, true) ~= nil, true, 'the table names what was done')
  end)
end

test('several features at several positions; pos lists with values over them; the causal mask holds', function()
  local model = family('gpt2')
  local c = transcoders('relu', 9)
  local g = sae.attribute(model, c, ids, {max_n_logits = 4, desired_logit_prob = 0.99})
  local clean = clean_logits(model)
  -- one feature at positions 3 and 5 with values 2 and -1, as two entries and as one with a tensor
  local two = sae.intervene(model, c, ids, {{2, 3, 4, 2.0}, {2, 5, 4, -1.0}}, {freeze_attention = false})
  local one = sae.intervene(model, c, ids, {{layer = 2, pos = {3, 5}, feature = 4, value = torch.tensor({2.0, -1.0})}},
    {freeze_attention = false})
  H.identical(one.logits, two.logits, 'a tensor of values over positions')
  close(two.logits:narrow(1, 1, 2), clean:narrow(1, 1, 2), 0, 'positions before the first intervened one unchanged')
  eq((two.logits[3] - clean[3]):abs():max():item() > 1e-4, true, 'position 3 changed')
  -- the first position's activations are zero (circuit-tracer's BOS): ablating there changes nothing
  local bos = sae.intervene(model, c, ids, {{1, 1, 1, 0}, {3, 1, 2, 0}}, {freeze_attention = false})
  H.identical(bos.logits, clean, 'the first position')
  local r = g:ablate({1, 2, 3})
  eq(r.after:size(1), g.logit_tokens:size(1), 'after: one probability a logit token')
  close(r.after, r.logits[T]:softmax(1):index_select(1, g.logit_tokens:to(r.logits.device)):cpu(), 1e-7, 'after: the rerun\'s softmax')
end)

test('whatever is attached is removed after an error, and the model runs clean after', function()
  local model = family('gpt2')
  local before = clean_logits(model)
  local wrong = H.randomize_transcoders(sae.clt{n_layers = L, d_model = 8, d_transcoder = 4, input_hook = 'mlp.hook_in',
    output_hook = 'mlp.hook_out'}, 3)
  eq(pcall(sae.intervene, model, wrong, ids, {{2, 3, 1, 1.0}}), false, 'transcoders 8 wide on a 16-wide model fail in the run')
  eq(#probe.list(model), 0, 'nothing left attached')
  H.identical(clean_logits(model), before, 'the model after the error')
end)

test('bad inputs are errors naming the function, the argument and both sides', function()
  local model = family('gpt2')
  local c = transcoders('relu', 9)
  local g = sae.attribute(model, c, ids, {max_n_logits = 4, desired_logit_prob = 0.99})
  local n = g.active_features:size(1)
  raises(function() sae.intervene(model, c, ids, {{4, 2, 1, 0}}) end, 'sae.intervene: interventions[1]: layer must be in 1..3, got 4')
  raises(function() sae.intervene(model, c, ids, {{1, 7, 1, 0}}) end,
    'sae.intervene: interventions[1]: pos must be in 1..6 (the prompt), got 7')
  raises(function() sae.intervene(model, c, ids, {{1, 2, 11, 0}}) end, 'sae.intervene: interventions[1]: feature must be in 1..10, got 11')
  raises(function() sae.intervene(model, c, ids, {{1, 2, 3, 0 / 0}}) end, 'sae.intervene: interventions[1]: value must be finite, got nan')
  raises(function() sae.intervene(model, c, ids, {{1, {2, 3}, 3, torch.tensor({1, 2, 3})}}) end,
    'sae.intervene: interventions[1]: value has 3 entries, the positions 2')
  raises_part(function() sae.intervene(model, c, ids, {{1, 2, 3, 0, valeu = 1}}) end, "unknown key 'valeu'")
  raises_part(function() sae.intervene(model, c, ids, {}, {freeze_atention = false}) end,
    "sae.intervene: unknown option 'freeze_atention'")
  raises_part(function() sae.intervene(model, c, ids, {}, {freeze_atention = false}) end, 'freeze_attention')
  raises(function() sae.intervene(model, c, ids, {}, {constrained_layers = {1, 4}}) end,
    'sae.intervene: constrained_layers[2] must be a layer in 1..3, got 4')
  raises(function() sae.intervene(model, c, ids, {}, {freeze_attention = 1}) end,
    'sae.intervene: freeze_attention must be true or false, got 1')
  raises(function() sae.intervene(model, c, {1, 99}, {}) end, 'sae.intervene: ids must lie in 1..24 (the vocabulary), got 1..99')
  raises_part(function() sae.intervene(model, c, 'a text', {}) end, 'sae.intervene: a text prompt needs a tokenizer')
  -- a text is tokenized as sae.attribute tokenizes it (no special token named: no BOS put first)
  local chars = require('anatomy.data').from_string('abcdefghijklmnopqrstuvwx')
  local by_text = sae.intervene(model, c, 'badcab', {{2, 3, 1, 2.5}}, {tokenizer = chars})
  local by_ids = sae.intervene(model, c, chars:encode('badcab'), {{2, 3, 1, 2.5}})
  close(by_text.logits, by_ids.logits, 0, 'a text gives its ids\' rerun')
  raises(function() sae.intervene(model, c, 'ab', {}, {tokenizer = 'char'}) end,
    'sae.intervene: tokenizer must be a data.tokenizer or a corpus (one with :encode), got string')
  raises(function() g:ablate({n + 1}) end, ('g:ablate: features[1] must index g.active_features, 1..%d, got %d'):format(n, n + 1))
  raises(function() g:ablate({}) end, 'g:ablate: features must be a non-empty list, got table')
  raises(function() g:steer({{1, 2, 3, 1.0, scale = 2}}) end, 'g:steer: interventions[1]: give value or scale, one of them')
  raises_part(function() g:steer({{1, 1, 1, scale = 2}}) end, 'g:steer: interventions[1]: scale multiplies an active feature')
  raises(function() g:steer({{1, 2, 3, value = 0 / 0}}) end, 'g:steer: interventions[1]: value must be finite, got nan')
  local left = probe.replace(model, require('anatomy.probe.points').part(model, 2, 'mlp'), function(t) return t * 0 end)
  raises_part(function() sae.intervene(model, c, ids, {}) end, 'sae.intervene: the model has replace at')
  left:remove()
  eq(#probe.list(model), 0, 'nothing left attached by the errors')
end)

H.done()
