-- g:qk: QK attributions of an attribution graph's frozen attention patterns
-- on a tiny GPT-2 (LayerNorm with bias, learned positions, QKV biases) and a
-- tiny Llama (RMSNorm, rotary, grouped-query), against the model itself and
-- the frozen model written out by hand: every pair and constant term sums
-- to the score read at the attention's scores point; the query (key)
-- vectors of the sources plus the constant part are the query (key) read
-- in the clean run; a source's vector is what adding its write by hand to
-- the frozen model changes in the query or key; the softmax over keys of
-- the per-key scores is the clean pattern row; the same identities on a
-- Qwen3 and a Gemma 3 (qk_norm, sliding windows); bad inputs are errors.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, close, raises = H.test, H.eq, H.close, H.raises
local points = require('anatomy.probe.points')
local pretrained = require('anatomy.models.pretrained')

local V, T = 24, 6
local ids = {1, 5, 9, 2, 17, 9}

local function family(kind) return H.tiny_lm(kind, kind == 'gpt2' and 1 or 2) end

local function transcoders(seed)
  return H.randomize_transcoders(sae.clt{n_layers = 3, d_model = 16, d_transcoder = 10, kind = 'relu',
    input_hook = 'mlp.hook_in', output_hook = 'mlp.hook_out'}, seed)
end

-- The model with its patterns, norm divisors and MLP outputs held at the
-- clean run's values (the clean run when `clean` is nil, which records
-- them), the MLP outputs plus add[m] (T, D), the token embeddings plus
-- tok_add (T, D); returns layer's queries and keys (T, heads, D) and, in
-- the clean run, its scores and pattern (H, T, T), and the record
local function frozen(model, kind, layer, clean, add, tok_add)
  local record, seen, hs = clean or {}, {}, {}
  local function hold(n, plus)
    hs[#hs + 1] = probe.replace(model, n, function(t)
      if not clean then record[n] = t:clone() return nil end
      return plus and record[n] + plus:view(1, T, -1) or record[n]
    end)
  end
  for l = 1, 3 do
    hold(points.part(model, l, 'attn') .. '.pattern')
    hold(points.part(model, l, 'ln1') .. '.scale')
    hold(points.part(model, l, 'ln2') .. '.scale')
    hold(points.part(model, l, 'mlp'), add and add[l])
  end
  hold(points.final_norm(model) .. '.scale')
  hold(points.embedding(model, 'tokens'), tok_add)
  local att = points.part(model, layer, 'attn')
  local rope = kind == 'llama' and 'rot_' or ''
  for _, p in ipairs{'q', 'k', 'scores', 'pattern'} do
    local at = att .. '.' .. ((p == 'q' or p == 'k') and rope or '') .. p
    hs[#hs + 1] = probe.replace(model, at, function(t) seen[p] = t[1]:float():cpu() end)
  end
  probe.with(hs, function() torch.no_grad(function() model(torch.tensor(ids):long():view(1, T)) end) end)
  return seen, record
end

-- what source s of g writes into the MLP outputs (add) or the token embeddings (tok_add)
local function write_of(g, s, model, clean)
  local n, c = g.active_features:size(1), g.transcoders
  if s <= n then
    local l, p, f = g.active_features[s][1]:item(), g.active_features[s][2]:item(), g.active_features[s][3]:item()
    local add = {}
    for m = l, 3 do
      add[m] = torch.zeros({T, 16}, {device = model:device()})
      add[m][p]:copy_(c:decoder(l)[f][m - l + 1]:detach() * g.activation_values[s]:item())
    end
    return add
  end
  local p = s - n - 3 * T
  local tok = torch.zeros({T, 16}, {device = model:device()})
  tok[p]:copy_(clean[points.embedding(model, 'tokens')][1][p])  -- the token's embedding, once more
  return nil, tok
end

for _, kind in ipairs{'gpt2', 'llama'} do
  test(kind .. ': pairs and constants sum to the score, the vectors to the query and key, each the change its write makes, '
    .. 'the softmax of the scores over keys to the pattern', function()
    local model = family(kind)
    local g = sae.attribute(model, transcoders(kind == 'gpt2' and 5 or 6), ids, {max_n_logits = 2})
    local n = g.active_features:size(1)
    local S = n + 4 * T
    -- llama: heads 2 and 3 read key heads 1 and 2 (4 heads in 2 groups)
    for _, lh in ipairs(kind == 'gpt2' and {{3, 2}, {2, 4}} or {{3, 3}, {2, 2}}) do
      local layer, head = lh[1], lh[2]
      local kv = kind == 'llama' and math.floor((head - 1) / 2) + 1 or head
      local clean_seen, clean = frozen(model, kind, layer)
      local r = g:qk(layer, head, {top_k = S * S})
      local q = T
      local _, most = clean_seen.pattern[head][q]:max(1)
      eq({r.query_pos, r.key_pos}, {q, most:item()}, 'the last query, and the key it attends to most')
      local k = r.key_pos
      local want = clean_seen.scores[head][q][k]:item()
      local rel = math.abs(r.score - want) / math.max(1, math.abs(want))
      eq(rel < 1e-4, true, ('layer %d head %d: pairs and constants %.7f, the model\'s score %.7f (relative %.2e)'):format(
        layer, head, r.score, want, rel))
      print(('  %s layer %d head %d, query %d key %d: score %.6f, the model\'s %.6f, relative difference %.2e'):format(
        kind, layer, head, q, k, r.score, want, rel))
      close(r.clean_score, want, 1e-6, 'clean_score is the score point\'s')
      close(r.query_vectors:sum(1) + r.query_constant, clean_seen.q[q][head], 1e-4, 'Σ a_s + a_0 is the clean query')
      close(r.key_vectors:sum(1) + r.key_constant, clean_seen.k[k][kv], 1e-4, 'Σ b_t + b_0 is the clean key (its group\'s)')
      -- every pair listed: they sum to Σ_s a_s·(Σ_t b_t)·scale, sorted by size
      local total, last = 0, math.huge
      for _, p in ipairs(r.pairs) do
        total = total + p.contribution
        eq(math.abs(p.contribution) <= last + 1e-12, true, 'pairs sorted by |contribution|')
        last = math.abs(p.contribution)
        eq(p.query.pos <= q and p.key.pos <= k, true, 'pairs within the positions each side reaches')
      end
      close(total, r.query_totals:sum():item(), 1e-4, 'the pairs sum to the query-side totals')
      close(r.key_totals:sum():item(), r.query_totals:sum():item(), 1e-4, 'and to the key-side totals')
      eq(#r.pairs > 10, true, 'pairs: ' .. #r.pairs)
      -- each source's vectors against its write added by hand to the frozen model
      local again = frozen(model, kind, layer, clean)
      close(again.q, clean_seen.q, 1e-5, 'the frozen run at the clean values is the clean run')
      local picked, worst, later = {}, 0, nil
      for s = 1, n do
        if r.query_vectors[s]:abs():sum():item() + r.key_vectors[s]:abs():sum():item() > 0 then picked[#picked + 1] = s end
        if not later and g.active_features[s][1]:item() >= layer then later = s end  -- writes after the attention: zero
      end
      eq(#picked >= 2, true, 'features reaching the query or key: ' .. #picked)
      eq(r.query_vectors[later]:abs():sum():item() + r.key_vectors[later]:abs():sum():item(), 0, 'a later layer\'s feature: zero')
      picked = {picked[1], picked[math.ceil(#picked / 2)], picked[#picked], later, n + 3 * T + 2, n + 3 * T + k}
      for _, s in ipairs(picked) do
        local add, tok = write_of(g, s, model, clean)
        local seen = frozen(model, kind, layer, clean, add, tok)
        worst = math.max(worst, (seen.q[q][head] - again.q[q][head] - r.query_vectors[s]):abs():max():item(),
          (seen.k[k][kv] - again.k[k][kv] - r.key_vectors[s]):abs():max():item())
      end
      eq(worst < 1e-4, true, ('%d sources by hand: largest difference %.2e'):format(#picked, worst))
      print(('  %d sources (%s) by hand: largest difference %.2e'):format(#picked, r:node(picked[1]).name, worst))
      -- the scores of every key the query sees, softmaxed: the clean pattern row
      local scores = {}
      for key = 1, q do scores[key] = g:qk(layer, head, {key_pos = key, top_k = 1}).score end
      local row = torch.tensor(scores):cpu():softmax(1)
      local diff = (row - clean_seen.pattern[head][q]:narrow(1, 1, q)):abs():max():item()
      eq(diff < 1e-5, true, ('the softmax of the %d scores is the pattern row: largest difference %.2e'):format(q, diff))
      print(('  pattern row from %d scores: largest difference %.2e'):format(q, diff))
    end
    -- an earlier query, named positions
    local r = g:qk(2, 1, {query_pos = 4, key_pos = 2, top_k = 3})
    local clean_seen = frozen(model, kind, 2)
    close(r.score, clean_seen.scores[1][4][2]:item(), 1e-4, 'query 4, key 2')
    eq(#r.pairs, 3, 'top_k pairs')
    local text = tostring(r)
    eq(text:match('^sae%.QK%(layer 2, head 1, query @4, key @2%)') ~= nil, true, text)
    eq(text:find('bias', 1, true) ~= nil and (text:find(' @%d') ~= nil), true, text)
    eq(r:node(1).name, ('L%d F%d @%d'):format(g.active_features[1][1]:item(), g.active_features[1][3]:item(),
      g.active_features[1][2]:item()), 'a feature is named by layer, feature and position')
    eq(r:node(n + T + 3).name, 'error L2 @3', 'an error node by layer and position')
    eq(r:node(n + 3 * T + 2).name, 'token 5 @2', 'a token by id (no tokenizer) and position')
    rawset(model, 'tokenizer', {decode = function(_, t) return ('<%d>'):format(t[1]) end})
    eq(g:qk(2, 1, {top_k = 1}):node(n + 3 * T + 2).name, "token '<5>' @2", "with the model's tokenizer, by its text")
    rawset(model, 'tokenizer', nil)
  end)
end

test('llama, per-layer transcoders with W_skip: the skip is a path, not a source; the sum and the vectors hold', function()
  local model = family('llama')
  local c = H.randomize_transcoders(sae.clt{n_layers = 3, d_model = 16, d_transcoder = 10, kind = 'relu', cross_layer = false,
    skip = true, input_hook = 'mlp.hook_in', output_hook = 'mlp.hook_out'}, 7)
  local g = sae.attribute(model, c, ids, {max_n_logits = 1})
  local clean_seen = frozen(model, 'llama', 3)
  local r = g:qk(3, 4, {query_pos = 5})
  local want = clean_seen.scores[4][5][r.key_pos]:item()
  local rel = math.abs(r.score - want) / math.max(1, math.abs(want))
  eq(rel < 1e-4, true, ('pairs and constants %.7f, the model\'s %.7f (relative %.2e)'):format(r.score, want, rel))
  print(('  with W_skip, query 5 key %d: relative difference %.2e'):format(r.key_pos, rel))
  close(r.query_vectors:sum(1) + r.query_constant, clean_seen.q[5][4], 1e-4, 'Σ a_s + a_0 is the clean query')
  close(r.key_vectors:sum(1) + r.key_constant, clean_seen.k[r.key_pos][2], 1e-4, 'Σ b_t + b_0 is the clean key')
end)

test('qwen3 (qk_norm over each head, its divisor frozen as the other norms\'): the sum, the vectors and the pattern row hold', function()
  local Q3 = require(pretrained.families.qwen3)
  torch.manual_seed(3)
  local model = Q3.build(Q3.check({model_type = 'qwen3', vocab_size = V, hidden_size = 16, intermediate_size = 32,
    num_hidden_layers = 3, num_attention_heads = 4, num_key_value_heads = 2, head_dim = 4, max_position_embeddings = 16}, 'test'))
  torch.no_grad(function() for _, p in ipairs(model:parameters()) do p:add_(torch.randn(p:size()) * 0.2) end end)
  model:eval()
  local g = sae.attribute(model, transcoders(8), ids, {max_n_logits = 1})
  local clean_seen = frozen(model, 'llama', 3)
  local r = g:qk(3, 3)
  local want = clean_seen.scores[3][T][r.key_pos]:item()
  local rel = math.abs(r.score - want) / math.max(1, math.abs(want))
  eq(rel < 1e-4, true, ('pairs and constants %.7f, the model\'s %.7f (relative %.2e)'):format(r.score, want, rel))
  close(r.query_vectors:sum(1) + r.query_constant, clean_seen.q[T][3], 1e-4, 'Σ a_s + a_0 is the clean query')
  close(r.key_vectors:sum(1) + r.key_constant, clean_seen.k[r.key_pos][2], 1e-4, 'Σ b_t + b_0 is the clean key')
  local scores = {}
  for key = 1, T do scores[key] = g:qk(3, 3, {key_pos = key, top_k = 1}).score end
  local diff = (torch.tensor(scores):cpu():softmax(1) - clean_seen.pattern[3][T]):abs():max():item()
  eq(diff < 1e-5, true, ('the pattern row: largest difference %.2e'):format(diff))
  print(('  qwen3 query %d key %d: relative difference %.2e, pattern row %.2e'):format(T, r.key_pos, rel, diff))
end)

test('gemma3 (sliding window, qk_norm with offset 1, query_pre_attn_scalar): the sum holds on a sliding and a full layer', function()
  local G3 = require(pretrained.families.gemma3_text)
  torch.manual_seed(4)
  local model = G3.build(G3.check({model_type = 'gemma3_text', vocab_size = V, hidden_size = 16, intermediate_size = 32,
    num_hidden_layers = 3, num_attention_heads = 4, num_key_value_heads = 2, head_dim = 4, max_position_embeddings = 16,
    sliding_window = 4, layer_types = {'sliding_attention', 'full_attention', 'sliding_attention'}}, 'test'))
  torch.no_grad(function() for _, p in ipairs(model:parameters()) do p:add_(torch.randn(p:size()) * 0.2) end end)
  model:eval()
  local long = {1, 5, 9, 2, 17, 9, 3}
  local g = sae.attribute(model, transcoders(3), long, {max_n_logits = 1})
  for _, lk in ipairs{{1, 4}, {2, 2}} do
    local layer, key = lk[1], lk[2]
    local seen
    local h = probe.replace(model, points.part(model, layer, 'attn') .. '.scores', function(t) seen = t[1]:float():cpu() end)
    probe.with({h}, function() torch.no_grad(function() model(torch.tensor(long):long():view(1, -1)) end) end)
    local r = g:qk(layer, 3, {key_pos = key})
    local want = seen[3][7][key]:item()
    local rel = math.abs(r.score - want) / math.max(1, math.abs(want))
    eq(rel < 1e-4, true, ('layer %d: pairs and constants %.7f, the model\'s %.7f (relative %.2e)'):format(layer, r.score, want, rel))
    print(('  gemma3 layer %d query 7 key %d: relative difference %.2e'):format(layer, key, rel))
  end
  raises(function() g:qk(1, 3, {key_pos = 2}) end, "g:qk: key_pos 2 is outside layer 1's sliding window of 4 from query_pos 7")
end)

test('bad inputs are errors naming the function, the argument and both sides', function()
  local model = family('llama')
  local g = sae.attribute(model, transcoders(6), ids, {max_n_logits = 1})
  raises(function() g:qk(2, 5) end, "g:qk: head must be a whole number in 1..4 (layer 2's heads), got 5")
  raises(function() g:qk(4, 1) end, "g:qk: layer must be a whole number in 1..3 (the graph's layers), got 4")
  raises(function() g:qk(0 / 0, 1) end, "g:qk: layer must be a whole number in 1..3 (the graph's layers), got nan")
  raises(function() g:qk(2, 1, {query_pos = 3, key_pos = 5}) end,
    "g:qk: key_pos 5 is after query_pos 3 (the head attends to positions up to the query's)")
  raises(function() g:qk(2, 1, {query_pos = 7}) end, "g:qk: query_pos must be a whole number in 1..6 (the prompt's positions), got 7")
  raises(function() g:qk(2, 1, {key_pos = 1.5}) end, "g:qk: key_pos must be a whole number in 1..6 (the prompt's positions), got 1.5")
  raises(function() g:qk(2, 1, {top_k = 0}) end, 'g:qk: top_k must be a whole number >= 1, got 0')
  raises(function() g:qk(2, 1, {querypos = 3}) end,
    "g:qk: unknown option 'querypos', did you mean 'query_pos'? (expected key_pos, query_pos, top_k)")
  raises(function() require('anatomy.features.graph_qk').qk({}, 1, 1) end,
    'g:qk: the graph must be what sae.attribute returns, got table')
  -- scores that are not bilinear in the stream: Gemma 2's soft-capped ones
  local c = transcoders(3)
  local G2 = require(pretrained.families.gemma2)
  local gemma = G2.build(G2.check({model_type = 'gemma2', vocab_size = V, hidden_size = 16, intermediate_size = 32,
    num_hidden_layers = 3, num_attention_heads = 4, num_key_value_heads = 2, head_dim = 4, max_position_embeddings = 16,
    final_logit_softcapping = 0, attn_logit_softcapping = 50}, 'test'))
  local gg = sae.attribute(gemma:eval(), c, ids, {max_n_logits = 1})
  raises(function() gg:qk(2, 1) end, "g:qk: layer 2's attention soft-caps its scores (softcap 50); they are not bilinear in the stream")
end)

H.done()
