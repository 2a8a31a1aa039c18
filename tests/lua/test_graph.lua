-- sae.attribute: attribution graphs of a tiny model (GPT-2's LayerNorm and
-- learned positions, Llama's RMSNorm and rotary attention) against the
-- frozen model written out by hand: the attention patterns, every norm's
-- divisor and every MLP's output held at their clean values, a source's
-- write added to the MLP outputs it decodes to, and the change read at each
-- target (a feature's encoder direction at its layer's MLP input, a
-- logit's demeaned unembedding column at the final norm's output) is that
-- edge of the adjacency matrix; the feature and error edges into each
-- target sum to what the MLPs' node writes carry to it, the token edges to
-- what the token embeddings carry; bad options are errors naming the
-- argument. circuit-tracer's own numbers: tests/parity/test_graph_parity.py.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, close, raises, raises_part = H.test, H.eq, H.close, H.raises, H.raises_part
local points = require('anatomy.probe.points')
local pretrained = require('anatomy.models.pretrained')

local V, T = 24, 6
local ids = {1, 5, 9, 2, 17, 9}

local function family(kind) return H.tiny_lm(kind, kind == 'gpt2' and 1 or 2) end

local function transcoders(kind, seed)
  return H.randomize_transcoders(sae.clt{n_layers = 3, d_model = 16, d_transcoder = 10, kind = kind,
    input_hook = 'mlp.hook_in', output_hook = 'mlp.hook_out'}, seed)
end

-- The model with its patterns, norm divisors and MLP outputs held at the
-- clean run's values (the clean run when `clean` is nil, which records
-- them), the MLP outputs plus add[m] (T, D) and the token embeddings times
-- tok_scale; returns each layer's MLP input, the final norm's output, and
-- the record
local function frozen(model, ids_t, clean, add, tok_scale)
  local record = clean or {}
  local seen = {x = {}}
  local handles = {}
  local names = {}
  for l = 1, 3 do
    names[#names + 1] = points.part(model, l, 'attn') .. '.pattern'
    names[#names + 1] = points.part(model, l, 'ln1') .. '.scale'
    names[#names + 1] = points.part(model, l, 'ln2') .. '.scale'
  end
  names[#names + 1] = points.final_norm(model) .. '.scale'
  for _, n in ipairs(names) do
    handles[#handles + 1] = probe.replace(model, n, function(t)
      if not clean then record[n] = t:clone() return nil end
      return record[n]
    end)
  end
  for l = 1, 3 do
    local mlp = points.part(model, l, 'mlp')
    handles[#handles + 1] = probe.replace(model, mlp, function(t, _, input)
      seen.x[l] = input[1]:clone()
      if not clean then record[mlp] = t:clone() return nil end
      return add and add[l] and record[mlp] + add[l]:view(1, T, -1) or record[mlp]
    end)
  end
  local embed = points.embedding(model, 'tokens')
  handles[#handles + 1] = probe.replace(model, embed, function(t)
    if not clean then record.tokens = t[1]:clone() return nil end
    return tok_scale and record.tokens:view(1, T, -1) * tok_scale or record.tokens:view(1, T, -1)
  end)
  handles[#handles + 1] = probe.replace(model, points.final_norm(model), function(t) seen.h = t[1]:clone() end)
  local logits = probe.with(handles, function() return torch.no_grad(function() return model(ids_t) end) end)
  return seen, record, logits
end

-- every target's reading of a run: features (n) then logits (K)
local function readings(g, c, seen, vecs)
  local out = {}
  for i = 1, g.active_features:size(1) do
    local l, p, f = g.active_features[i][1]:item(), g.active_features[i][2]:item(), g.active_features[i][3]:item()
    out[#out + 1] = seen.x[l][p]:cpu():dot(c.W_enc[l][f]:detach():cpu()):item()
  end
  for k = 1, vecs:size(1) do out[#out + 1] = seen.h[T]:cpu():dot(vecs[k]):item() end
  return torch.tensor(out)
end

for _, kind in ipairs{'gpt2', 'llama'} do
  for _, tkind in ipairs{'relu', 'jumprelu'} do
    test(kind .. ', a ' .. tkind .. ' CLT: every column of the adjacency matrix is the change its source makes through the frozen model',
    function()
      local model = family(kind)
      local c = transcoders(tkind, (kind == 'gpt2' and 5 or 6) + (tkind == 'relu' and 0 or 10))
      local g = sae.attribute(model, c, ids, {max_n_logits = 4, desired_logit_prob = 0.99, batch_size = 7})
      local n, K = g.active_features:size(1), g.logit_tokens:size(1)
      local N = n + 4 * T + K
      eq(g.adjacency_matrix:size(), {N, N}, 'nodes: features, errors and tokens a position, logits')
      eq(n > 10, true, 'features active: ' .. n)
      eq(g.active_features:select(2, 2):min():item() >= 2, true, "the first position's features are no nodes")
      local ids_t = torch.tensor(ids):long():view(1, T)
      local clean_seen, clean, clean_logits = frozen(model, ids_t)
      local again_seen, _, again_logits = frozen(model, ids_t, clean)
      close(again_logits, clean_logits, 1e-5, 'the frozen run at the clean values is the clean run')
      -- the logits chosen: the top ones by probability, and the vectors their unembedding less the mean
      local probs = clean_logits[1][T]:cpu():softmax(1)
      local top_p, top_i = probs:topk(K)
      eq(g.logit_tokens:tolist(), top_i:tolist(), 'the top logits')
      close(g.logit_probabilities, top_p, 1e-6, 'their probabilities')
      local W = model:unembedding():detach():cpu()
      local vecs = W:index_select(1, g.logit_tokens) - W:mean(1, true)
      local base = readings(g, c, again_seen, vecs)
      -- each feature's write, a · W_dec_l[f, m − l] into the MLP outputs m ≥ l at its position
      local A = g.adjacency_matrix
      local targets = {}
      for i = 1, n do targets[i] = i end
      for k = 1, K do targets[n + k] = n + 4 * T + k end
      local worst = 0
      for s = 1, n do
        local l, p, f = g.active_features[s][1]:item(), g.active_features[s][2]:item(), g.active_features[s][3]:item()
        local a = g.activation_values[s]:item()
        local add = {}
        for m = l, 3 do
          add[m] = torch.zeros({T, 16}, {device = model:device()})
          add[m][p]:copy_(c:decoder(l)[f][m - l + 1]:detach() * a)
        end
        local changed = readings(g, c, (frozen(model, ids_t, clean, add)), vecs) - base
        local want = {}
        for i, t in ipairs(targets) do want[i] = A[t][s]:item() end
        local diff = (changed - torch.tensor(want)):abs():max():item()
        worst = math.max(worst, diff)
      end
      eq(worst < 1e-4, true, ('every feature column against the frozen model, largest difference %.2e'):format(worst))
      print(('  %d features x %d targets: largest difference %.2e'):format(n, #targets, worst))
      -- all node writes of the MLPs (features and errors: the output less b_dec) taken out: the change is the sum of their edges
      local minus = {}
      for m = 1, 3 do minus[m] = -(clean[points.part(model, m, 'mlp')][1] - c.b_dec[m]:detach()) end  -- no skip here
      for m = 1, 3 do minus[m][1]:zero_() end  -- the first position: no nodes there
      local without = readings(g, c, (frozen(model, ids_t, clean, minus)), vecs)
      local sums, want_sum = {}, {}
      for i, t in ipairs(targets) do
        sums[i] = A[t]:narrow(1, 1, n + 3 * T):sum():item()
        want_sum[i] = base[i]:item() - without[i]:item()
      end
      close(torch.tensor(sums), torch.tensor(want_sum), 1e-4, 'feature and error edges into each target sum to the MLP writes')
      -- the token embeddings scaled to zero: the token edges' sum
      local no_tokens = readings(g, c, (frozen(model, ids_t, clean, nil, 0)), vecs)
      for i, t in ipairs(targets) do
        sums[i] = A[t]:narrow(1, n + 3 * T + 1, T):sum():item()
        want_sum[i] = base[i]:item() - no_tokens[i]:item()
      end
      close(torch.tensor(sums), torch.tensor(want_sum), 1e-4, 'token edges into each target sum to the embeddings')
      eq(A:narrow(1, n + 1, 4 * T):abs():sum():item(), 0, 'error and token rows are zero')
      eq(A:narrow(2, n + 4 * T + 1, K):abs():sum():item(), 0, 'logit columns are zero')
    end)
  end
end

test("pruned as circuit-tracer's prune_graph: tokens and logits kept, every kept feature fed and read, fewer kept at lower thresholds",
function()
  local model = family('llama')
  local c = transcoders('jumprelu', 16)
  local g = sae.attribute(model, c, ids, {max_n_logits = 3, desired_logit_prob = 0.9})
  local n, K, N = g.active_features:size(1), g.logit_tokens:size(1), g.adjacency_matrix:size(1)
  -- max_feature_nodes: the rows and columns of the features visited are the full graph's
  local capped = sae.attribute(model, c, ids, {max_n_logits = 3, desired_logit_prob = 0.9, max_feature_nodes = 12,
    update_interval = 1, batch_size = 4})
  local sel = capped.selected_features
  eq(sel:size(1), 12, 'twelve features visited')
  local keep = {}
  for _, i in ipairs(sel:tolist()) do keep[#keep + 1] = i end
  for j = n + 1, N do keep[#keep + 1] = j end
  local idx = torch.tensor(keep):long():cpu()
  local want = g.adjacency_matrix:index_select(1, idx):index_select(2, idx)
  close(capped.adjacency_matrix, want, 1e-5, 'the capped graph is the full one on the visited features')
  -- the first visited are the features the logits' rows weigh most, through their own edges
  local direct = g.adjacency_matrix:narrow(1, N - K + 1, K):narrow(2, 1, n):abs()
  direct = (direct / g.adjacency_matrix:narrow(1, N - K + 1, K):abs():sum(2, true)):t():matmul(g.logit_probabilities:view(-1, 1)):view(-1)
  local _, top = direct:sort(1, true)
  local chosen = {}
  for _, i in ipairs(sel:tolist()) do chosen[i] = true end
  for r = 1, 4 do eq(chosen[top[r]:item()], true, 'a feature among the 4 the logits weigh most is visited') end
  local p = sae.prune_graph(g)
  local kept = p.node_mask:long():sum():item()
  eq(p.node_mask:narrow(1, N - K - T + 1, K + T):all():item(), true, 'tokens and logits kept')
  eq(kept > K + T and kept < N, true, ('some features or errors kept, not all: %d of %d'):format(kept, N))
  local edges = p.edge_mask
  local off = p.node_mask:logical_not()
  eq(edges:masked_select(off:view(-1, 1):expand(N, N)):any():item(), false, 'no kept edge into a dropped node')
  eq(edges:masked_select(off:view(1, -1):expand(N, N)):any():item(), false, 'no kept edge out of a dropped node')
  for i = 1, n do
    if p.node_mask[i]:item() then
      eq(edges[i]:any():item() and edges:select(2, i):any():item(), true, 'kept feature ' .. i .. ' is fed and read')
    end
  end
  eq(edges:logical_and(g.adjacency_matrix:eq(0)):any():item(), false, 'kept edges are edges')
  close(p.cumulative_scores:max(), 1, 1e-6, 'the least influential node closes the cumulative share')
  local tight = sae.prune_graph(g, {node_threshold = 0.5, edge_threshold = 0.9})
  eq(tight.node_mask:long():sum():item() < kept, true, 'a lower node threshold keeps fewer nodes')
  eq(tight.node_mask:logical_and(p.node_mask:logical_not()):any():item(), false, 'and only nodes the looser one kept')
  local replacement, completeness = sae.graph_scores(g)
  eq(replacement > 0 and replacement < 1 and completeness > 0 and completeness < 1, true,
    ('scores in (0, 1): %.4f, %.4f'):format(replacement, completeness))
  raises(function() sae.prune_graph(g, {node_threshold = 1.2}) end, 'sae.prune_graph: node_threshold must be a number in [0, 1], got 1.2')
  raises(function() sae.prune_graph(g, {edge_treshold = 0.9}) end,
    "sae.prune_graph: unknown option 'edge_treshold', did you mean 'edge_threshold'? (expected edge_threshold, node_threshold)")
  raises(function() sae.graph_scores({}) end, 'sae.graph_scores: graph must be what sae.attribute returns, got table')
end)

-- A byte-level tokenizer of the model's 24 tokens: 'a' .. 'w', then <|endoftext|> (24, 1-based), which
-- tokenizer_config.json (`config`, when given) may name
local function tokenizer(config)
  local fs, json = require('anatomy.io.fs'), require('anatomy.io.json')
  local vocab = {}
  for i = 0, V - 2 do vocab[string.char(97 + i)] = i end
  local dir = H.tmpdir()
  fs.write_atomic(dir .. '/tokenizer.json', json.encode({version = '1.0', normalizer = json.null, post_processor = json.null,
    added_tokens = {{id = V - 1, content = '<|endoftext|>', special = true, lstrip = false, rstrip = false,
      single_word = false, normalized = false}},
    pre_tokenizer = {type = 'ByteLevel', add_prefix_space = false, trim_offsets = true, use_regex = true},
    decoder = {type = 'ByteLevel'}, model = {type = 'BPE', dropout = json.null, vocab = vocab, merges = {}}}))
  if config then fs.write_atomic(dir .. '/tokenizer_config.json', json.encode(config)) end
  return require('anatomy.data').tokenizer(dir)
end

test("a text prompt: the tokenizer's ids with its BOS first (circuit-tracer's ensure_tokenized), the graph of those ids",
function()
  local model = family('gpt2')
  local c = transcoders('jumprelu', 7)
  local tok = tokenizer({bos_token = '<|endoftext|>'})
  local g = sae.attribute(model, c, 'badcab', {tokenizer = tok, max_n_logits = 3})
  local want = {V, 2, 1, 4, 3, 1, 2}  -- <|endoftext|> b a d c a b
  eq(g.input_tokens:tolist(), want, 'the BOS, then the text')
  local by_ids = sae.attribute(model, c, want, {max_n_logits = 3})
  eq(g.active_features:tolist(), by_ids.active_features:tolist(), 'the same features')
  close(g.adjacency_matrix, by_ids.adjacency_matrix, 0, 'the same graph as its ids')
  eq(g.logit_tokens:tolist(), by_ids.logit_tokens:tolist(), 'the same logits')
  rawset(model, 'tokenizer', tok)  -- the model's own tokenizer, as models.from_pretrained sets it
  eq(sae.attribute(model, c, 'badcab', {max_n_logits = 1}).input_tokens:tolist(), want, "the model's tokenizer")
  rawset(model, 'tokenizer', nil)
  eq(sae.attribute(model, c, '<|endoftext|>ab', {tokenizer = tok, max_n_logits = 1}).input_tokens:tolist(), {V, 1, 2},
    'a text starting with a special token gets no second one')
  eq(sae.attribute(model, c, 'badc', {tokenizer = tokenizer({eos_token = '<|endoftext|>'}), max_n_logits = 1})
    .input_tokens:tolist(), {V, 2, 1, 4, 3}, 'no bos_token named: its eos_token first')
  eq(sae.attribute(model, c, 'badc', {tokenizer = tokenizer(), max_n_logits = 1}).input_tokens:tolist(), {2, 1, 4, 3},
    'no special token named (transformers makes none of the file\'s special): nothing first')
  local chars = require('anatomy.data').from_string('abcdefghijklmnopqrstuvw')  -- 23 chars: no special token
  eq(sae.attribute(model, c, 'cab', {tokenizer = chars, max_n_logits = 1}).input_tokens:tolist(), chars:encode('cab'):tolist(),
    'a char corpus: nothing first, its first char is the left-out position')
  raises(function() sae.attribute(model, c, 'badcab') end,
    'sae.attribute: a text prompt needs a tokenizer: pass {tokenizer = tok} (a data.tokenizer or a corpus), '
    .. 'or use a model from models.from_pretrained')
  raises(function() sae.attribute(model, c, 'ab', {tokenizer = 'char'}) end,
    'sae.attribute: tokenizer must be a data.tokenizer or a corpus (one with :encode), got string')
  raises(function() sae.attribute(model, c, '', {tokenizer = tok}) end, 'sae.attribute: the prompt "" has no tokens')
end)

test('bad options and inputs are errors naming the argument', function()
  local model = family('gpt2')
  local c = transcoders('relu', 5)
  raises(function() sae.attribute(model, c, ids, {max_n_logit = 3}) end,
    "sae.attribute: unknown option 'max_n_logit', did you mean 'max_n_logits'? (expected batch_size, desired_logit_prob, max_feature_nodes, max_n_logits, tokenizer, update_interval)")
  raises(function() sae.attribute(model, c, ids, {max_n_logits = 0}) end,
    'sae.attribute: max_n_logits must be a whole number >= 1, got 0')
  raises(function() sae.attribute(model, c, ids, {batch_size = 0 / 0}) end,
    'sae.attribute: batch_size must be a whole number >= 1, got nan')
  raises(function() sae.attribute(model, c, ids, {max_feature_nodes = 2.5}) end,
    'sae.attribute: max_feature_nodes must be a whole number >= 1, got 2.5')
  raises(function() sae.attribute(model, c, ids, {desired_logit_prob = 1.5}) end,
    'sae.attribute: desired_logit_prob must be a number in (0, 1], got 1.5')
  raises(function() sae.attribute(model, c, {1, 99}) end, 'sae.attribute: ids must lie in 1..24 (the vocabulary), got 1..99')
  raises(function() sae.attribute(model, c, {3}) end, 'sae.attribute: ids must be one prompt of at least 2 tokens, (T) or (1, T), got shape (1)')
  raises(function() sae.attribute(model, {}, ids) end, 'sae.attribute: transcoders must be a sae.CLT (sae.clt, sae.load_clt), got table')
  local ablation = probe.replace(model, points.part(model, 2, 'attn'), function(t) return t * 0 end)
  raises_part(function() sae.attribute(model, c, ids) end, 'sae.attribute: the model has replace at h.2.attn attached')
  ablation:remove()
  eq(sae.attribute(model, c, ids, {max_n_logits = 1}).logit_tokens:size(1), 1, 'removed, the model is attributed again')
  -- a Gemma 2 that soft-caps its logits: as circuit-tracer, the logits and probabilities are the capped ones, the
  -- edges those into the logits before the cap (the same as without the cap)
  local G2 = require(pretrained.families.gemma2)
  local function gemma(cap)
    torch.manual_seed(7)
    local m = G2.build(G2.check({model_type = 'gemma2', vocab_size = V, hidden_size = 16, intermediate_size = 32,
      num_hidden_layers = 3, num_attention_heads = 4, num_key_value_heads = 2, head_dim = 4, max_position_embeddings = 16,
      final_logit_softcapping = cap}, 'test'))
    m:eval()
    return m
  end
  local capped_model, free_model = gemma(2), gemma(require('anatomy.io.json').null)
  local gc = sae.attribute(capped_model, c, ids, {max_n_logits = 3, desired_logit_prob = 1})
  local gf = sae.attribute(free_model, c, ids, {max_n_logits = 3, desired_logit_prob = 1})
  eq(gc.logit_tokens:tolist(), gf.logit_tokens:tolist(), 'the cap keeps the order of the logits')
  close(gc.adjacency_matrix, gf.adjacency_matrix, 0, 'the edges are those before the cap')
  local capped_logits = torch.no_grad(function() return capped_model(torch.tensor(ids):long():view(1, -1)) end)[1][#ids]:float():cpu()
  close(gc.logit_probabilities, capped_logits:softmax(1):index_select(1, gc.logit_tokens), 1e-6,
    'the probabilities are the capped logits\'')
  if (gc.logit_probabilities - gf.logit_probabilities):abs():max():item() < 1e-3 then
    error('the cap should change the probabilities')
  end
  -- the graph is a sae.Graph: its methods are the module's functions
  local g = sae.attribute(model, c, ids, {max_n_logits = 2})
  eq(require('anatomy.nn').typename(g), 'sae.Graph', 'a sae.Graph')
  eq(g.model, model, 'it keeps its model')
  eq(g.transcoders, c, 'and its transcoders')
  eq(tostring(g):match('^sae%.Graph%(%d+ positions, 3 layers'), 'sae.Graph(' .. #ids .. ' positions, 3 layers', tostring(g))
  close(g:prune().cumulative_scores, sae.prune_graph(g).cumulative_scores, 0, 'g:prune is sae.prune_graph')
  eq({g:scores()}, {sae.graph_scores(g)}, 'g:scores is sae.graph_scores')
  local two = sae.clt{n_layers = 2, d_model = 16, d_transcoder = 4, input_hook = 'mlp.hook_in', output_hook = 'mlp.hook_out'}
  raises(function() sae.attribute(model, two, ids) end, 'sae.attribute: the transcoders have 2 layers, the model 3')
end)

H.done()
