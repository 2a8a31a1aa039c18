-- g:report: an attribution graph as a self-contained HTML page. The page is
-- read back as text: one node element per kept node and one edge element per
-- kept edge (sae.prune_graph's masks), the table's numbers equal to the
-- pruned graph's (activations, cumulative scores, each node's influence
-- computed here from the adjacency matrix, the scores of sae.graph_scores),
-- the feature links where feature_url is given and no other outside
-- reference, max_nodes' cut stated, bad options named, and a failed write
-- leaving no file. How it looks: scripts/report-screenshot on a report.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, close, raises, raises_part = H.test, H.eq, H.close, H.raises, H.raises_part
local pretrained = require('anatomy.models.pretrained')
local format = require('anatomy.render.format')
local fs = require('anatomy.io.fs')

local V = 24
local ids = {1, 5, 9, 2, 17, 9, 3, 11}
local T = #ids
local words = {}
for i = 1, V do words[i] = ' w' .. i end
words[1], words[9] = '<bos>', ' cat & "dog"'  -- one that must be escaped
local tok = {decode = function(_, list) return words[list[1]] end}

local function graph()
  local F = require(pretrained.families.gpt2)
  torch.manual_seed(3)
  local m = F.build(F.check({model_type = 'gpt2', vocab_size = V, n_positions = 16, n_embd = 16, n_layer = 3, n_head = 4}, 'test'))
  torch.no_grad(function() for _, p in ipairs(m:parameters()) do p:add_(torch.randn(p:size()) * 0.2) end end)
  m:eval()
  local c = H.randomize_transcoders(sae.clt{n_layers = 3, d_model = 16, d_transcoder = 10, kind = 'jumprelu',
    input_hook = 'mlp.hook_in', output_hook = 'mlp.hook_out'}, 16)
  return sae.attribute(m, c, ids, {max_n_logits = 4, desired_logit_prob = 0.95})
end
local g = graph()
local dir = H.tmpdir()

local function count(s, pattern)
  local n = 0
  for _ in s:gmatch(pattern) do n = n + 1 end
  return n
end

-- the table's rows: {id, cells}, in order
local function rows(html)
  local out = {}
  for id, body in html:gmatch('<tr data%-node="(%d+)"[^>]*>(.-)</tr>') do
    local cells = {}
    for cell in body:gmatch('<td[^>]*>(.-)</td>') do cells[#cells + 1] = cell end
    out[#out + 1] = {id = tonumber(id), cells = cells}
  end
  return out
end

-- each node's influence on the logits as a share of the total, computed
-- here: w Â + w Â² + ... with Â the row-normalised absolute adjacency
local function influence_shares()
  local A = g.adjacency_matrix:abs()
  A = A / A:sum(2, true):clamp_min(1e-10)
  local N, K = A:size(1), g.logit_tokens:size(1)
  local w = torch.zeros({N}, {device = 'cpu'})
  w:narrow(1, N - K + 1, K):copy_(g.logit_probabilities)
  local total, cur = torch.zeros({N}, {device = 'cpu'}), w:view(1, -1)
  for _ = 1, 50 do cur = cur:matmul(A); total = total + cur:view(-1) end
  return total / total:sum()
end

test('one node element per kept node, one edge per kept edge, the table equal to the pruned graph', function()
  local path = g:report(dir .. '/sub/graph.html', {tokenizer = tok, feature_url = 'features/L{layer}.html#f{feature}'})
  eq(path, dir .. '/sub/graph.html', 'the path returned')
  local html = H.read(path)
  local p = sae.prune_graph(g)
  local kept, kept_edges = p.node_mask:long():sum():item(), p.edge_mask:long():sum():item()
  local N, K, n = g.adjacency_matrix:size(1), g.logit_tokens:size(1), g.selected_features:size(1)
  eq(count(html, '<g class="node '), kept, 'node elements')
  eq(count(html, '<path class="edge"'), kept_edges, 'edge elements')
  eq(html:match('data%-edges="(%d+)"'), tostring(kept_edges), 'the chart says how many edges it draws')
  local drawn = {}
  for id in html:gmatch('<g class="node %a+" data%-node="(%d+)"') do drawn[tonumber(id)] = true end
  for i = 1, N do eq(drawn[i] == true, p.node_mask[i]:item(), 'node ' .. i .. ' drawn where kept') end
  -- every edge element is a kept edge, with its weight
  local mask, A = p.edge_mask, g.adjacency_matrix
  for s, t, w in html:gmatch('<path class="edge" data%-source="(%d+)" data%-target="(%d+)".-<title>.-: ([^<]+)</title>') do
    s, t = tonumber(s), tonumber(t)
    eq(mask[t][s]:item(), true, ('edge %d -> %d is kept'):format(s, t))
    eq(w, format.number(A[t][s]:item(), 4), ('edge %d -> %d weight'):format(s, t))
  end
  local r = rows(html)
  eq(#r, kept, 'table rows')
  local share = influence_shares()
  local cum = p.cumulative_scores
  local active, acts, sel = g.active_features, g.activation_values, g.selected_features
  local largest, last = 0, -1
  for i, row in ipairs(r) do
    local id, c = row.id, row.cells
    eq(p.node_mask[id]:item(), true, 'row ' .. i .. ' is a kept node')
    if i <= K then
      eq(c[2], 'logit', 'the logits first')
      eq(id, N - K + i, 'by probability')
      eq(c[8], format.number(g.logit_probabilities[i]:item(), 4), 'logit probability')
    else
      local v = tonumber(c[9])
      largest = math.max(largest, math.abs(v - share[id]:item()))
      eq(c[10], format.number(cum[id]:item(), 4), 'cumulative score of node ' .. id)
      eq(cum[id]:item() >= last, true, 'then by influence')
      last = cum[id]:item()
    end
    if id <= n then
      local a = sel[id]:item()
      eq(c[2], 'feature', 'kind')
      eq({tonumber(c[3]), tonumber(c[4])}, {active[a][1]:item(), active[a][2]:item()}, 'layer and position')
      eq(c[6], ('<a href="features/L%d.html#f%d">%d</a>'):format(active[a][1]:item(), active[a][3]:item(), active[a][3]:item()),
        'the feature index, linked')
      eq(c[7], format.number(acts[a]:item(), 4), 'activation')
    end
  end
  print(('  %d of %d nodes, %d edges; influence shares within %.2g of the series computed here'):format(kept, N, kept_edges, largest))
  eq(largest < 1e-4, true, 'influence as the series gives it (4 decimals)')
  local replacement, completeness = sae.graph_scores(g)
  eq(html:find(('Replacement score %.4f'):format(replacement), 1, true) ~= nil, true, 'the replacement score')
  eq(html:find(('completeness score %.4f'):format(completeness), 1, true) ~= nil, true, 'the completeness score')
  eq(html:find(('kept <b>%d of %d nodes</b>'):format(kept, N), 1, true) ~= nil, true, 'nodes kept of N')
  eq(html:find(('<b>%d of %s edges</b>'):format(kept_edges, format.count(A:ne(0):long():sum():item())), 1, true) ~= nil, true,
    'edges kept of all')
  eq(html:find('cat &amp; &quot;dog&quot;', 1, true) ~= nil, true, 'tokens escaped')
  eq(html:find('<dt>software</dt>', 1, true) ~= nil and html:find('<dt>transcoders</dt>', 1, true) ~= nil, true, 'provenance')
  -- the feature links: one on each feature node and each feature row, nothing else outside
  local features = 0
  for _, row in ipairs(r) do if row.id <= n then features = features + 1 end end
  eq(count(html, 'href="'), 2 * features, 'a link on each kept feature node and row')
  eq(count(html, 'src='), 0, 'nothing loaded from anywhere')
  eq(count(html, 'https?://'), 0, 'no outside address')
  eq(count(html, 'url%('), 0, 'no CSS url()')
end)

test('feature_url as a function, and only its addresses reach outside', function()
  local seen = {}
  local html = H.read(g:report(dir .. '/f.html', {feature_url = function(layer, feature)
    seen[#seen + 1] = layer .. '/' .. feature
    return ('https://example.org/l%d/f%d?a=1&b=2'):format(layer, feature)
  end}))
  eq(#seen > 0, true, 'called for the kept features')
  local outside = 0
  for before, url in html:gmatch('(......)(https?://[^"]*)') do
    eq(before, 'href="', 'an address only in a link')
    eq(url:match('^https://example%.org/l%d+/f%d+%?a=1&amp;b=2$') ~= nil, true, 'a feature link, escaped: ' .. url)
    outside = outside + 1
  end
  eq(outside, 2 * #seen, 'each feature node and row')
  eq(html:find('>#17<', 1, true) ~= nil or html:find('>#9<', 1, true) ~= nil, true, 'token ids without a tokenizer')
  rawset(g.model, 'tokenizer', tok)
  local named = H.read(g:report(dir .. '/t.html'))
  rawset(g.model, 'tokenizer', nil)
  eq(named:find(' w17', 1, true) ~= nil, true, "the model's tokenizer by default")
end)

test('max_nodes draws the most influential, says so, and the table keeps every kept node', function()
  local html = H.read(g:report(dir .. '/cut.html', {max_nodes = 3, title = 'cut'}))
  local p = sae.prune_graph(g)
  local K = g.logit_tokens:size(1)
  eq(count(html, '<g class="node '), 3 + T + K, 'three features or errors, every token and logit')
  eq(html:match('data%-nodes="(%d+)"'), tostring(3 + T + K), 'the chart says how many nodes it draws')
  eq(html:find('(max_nodes = 3)', 1, true) ~= nil, true, 'the cut is stated')
  eq(html:find('<title>cut</title>', 1, true) ~= nil, true, 'the title')
  local r = rows(html)
  eq(#r, p.node_mask:long():sum():item(), 'every kept node in the table')
  eq(count(html, '<tr data%-node="%d+" class="undrawn">'), #r - 3 - T - K, 'the ones not drawn marked')
  local drawn, edges = {}, 0
  for id in html:gmatch('<g class="node %a+" data%-node="(%d+)"') do drawn[#drawn + 1] = tonumber(id) end
  local idx = torch.tensor(drawn):long():cpu()
  edges = p.edge_mask:index_select(1, idx):index_select(2, idx):long():sum():item()
  eq(count(html, '<path class="edge"'), edges, 'the kept edges between drawn nodes')
  -- the first features or errors by influence are the ones drawn
  local n_drawn = 0
  for i = K + 1, #r do
    if r[i].cells[2] == 'feature' or r[i].cells[2] == 'error' then
      n_drawn = n_drawn + 1
      eq(html:find(('data-node="%d"><title>'):format(r[i].id), 1, true) ~= nil, n_drawn <= 3, 'drawn: row ' .. i)
    end
  end
end)

test('with max_feature_nodes, each feature row is the visited feature its node is', function()
  local capped = sae.attribute(g.model, g.transcoders, ids, {max_n_logits = 4, desired_logit_prob = 0.95, max_feature_nodes = 12})
  local html = H.read(capped:report(dir .. '/capped.html', {feature_url = '{layer}/{feature}'}))
  local p = capped:prune()
  local sel, active, acts = capped.selected_features, capped.active_features, capped.activation_values
  eq(count(html, '<g class="node '), p.node_mask:long():sum():item(), 'node elements')
  local features = 0
  for _, row in ipairs(rows(html)) do
    if row.id <= sel:size(1) then
      local a = sel[row.id]:item()
      local l, pos, f = active[a][1]:item(), active[a][2]:item(), active[a][3]:item()
      eq({row.cells[3], row.cells[4], row.cells[6], row.cells[7]}, {tostring(l), tostring(pos),
        ('<a href="%d/%d">%d</a>'):format(l, f, f), format.number(acts[a]:item(), 4)}, 'feature node ' .. row.id)
      features = features + 1
    end
  end
  eq(features > 0, true, 'some visited features kept')
end)

test('bad options are errors naming them, and a failed write leaves no file', function()
  local path = dir .. '/bad.html'
  raises(function() g:report(path, {node_treshold = 0.5}) end,
    "g:report: unknown option 'node_treshold', did you mean 'node_threshold'? (expected edge_threshold, feature_url, max_nodes, "
    .. 'node_threshold, title, tokenizer)')
  raises(function() g:report(path, {node_threshold = 1.5}) end, 'g:report: node_threshold must be a number in [0, 1], got 1.5')
  raises(function() g:report(path, {edge_threshold = 0 / 0}) end, 'g:report: edge_threshold must be a number in [0, 1], got nan')
  raises(function() g:report(path, {max_nodes = 0}) end, 'g:report: max_nodes must be a whole number >= 1, got 0')
  raises(function() g:report(path, {title = 3}) end, 'g:report: title must be a string, got number')
  raises(function() g:report(path, {tokenizer = 'gpt2'}) end,
    'g:report: tokenizer must be a tokenizer (data.tokenizer: one with tok:decode(ids)), got string')
  raises(function() g:report(path, {feature_url = 'features/{layer}.html'}) end,
    'g:report: feature_url must be a function(layer, feature) or a string with {feature} (and {layer}) in it, got "features/{layer}.html"')
  raises(function() g:report(nil) end, 'g:report: path must be a file path, got nil')
  raises_part(function() require('anatomy.features.graph_report').report({}, path) end, 'g:report: graph must be what sae.attribute returns')
  local ok, err = pcall(function() g:report(path, {feature_url = 3}) end)
  eq(ok, false, 'feature_url a number')
  eq(tostring(err):match('^[^:]+:%d+:') ~= nil and tostring(err):find('test_graph_report', 1, true) ~= nil, true,
    "the error at the caller's line: " .. tostring(err))
  eq(fs.exists(path), false, 'no file after the errors')
  -- an error while the page is made leaves the file that was there as it was, and no temporary beside it
  g:report(path)
  local before = H.read(path)
  raises(function() g:report(path, {feature_url = function() return nil end}) end,
    'must return a string, got nil')
  eq(H.read(path) == before, true, 'the earlier report untouched')
  raises_part(function() g:report('/proc/anatomy-no/graph.html') end, '/proc/anatomy-no')
  eq(fs.list(dir .. '/'), {'bad.html', 'capped.html', 'cut.html', 'f.html', 'sub', 't.html'}, 'no temporary files left')
end)

H.done()
