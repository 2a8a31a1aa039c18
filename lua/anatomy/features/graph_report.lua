-- g:report(path, opts): an attribution graph as one self-contained HTML file
-- (inline SVG, CSS and a little JS; nothing fetched), drawn as circuit-tracer's
-- and Neuronpedia's graph viewers draw it (render/attribution.lua), with the
-- table of the same kept nodes beside it, the pruning and the graph's scores
-- (graph_prune.lua) and the provenance. N nodes, n feature nodes, L layers,
-- T positions, K logits.
local torch = require('anatomy.torch')
local options = require('anatomy.torch.options')
local fs = require('anatomy.io.fs')
local provenance = require('anatomy.io.provenance')
local format = require('anatomy.render.format')
local page = require('anatomy.render.page')
local attribution = require('anatomy.render.attribution')
local prune = require('anatomy.features.graph_prune')

local M = {}
local WHERE = 'g:report'
local esc = require('anatomy.render.svg').esc

-- feature_url: a function(layer, feature) -> url, or a string with {layer} and {feature} in it
local function url_maker(u)
  if u == nil then return nil end
  if type(u) == 'function' then
    return function(layer, feature)
      local url = u(layer, feature)
      if type(url) ~= 'string' then
        error(('%s: feature_url(%d, %d) must return a string, got %s'):format(WHERE, layer, feature, type(url)), 0)
      end
      return url
    end
  end
  if type(u) ~= 'string' or not u:find('{feature}', 1, true) then
    error(('%s: feature_url must be a function(layer, feature) or a string with {feature} (and {layer}) in it, got %s'):format(
      WHERE, type(u) == 'string' and ('%q'):format(u) or type(u)), 4)
  end
  return function(layer, feature)
    return (u:gsub('{layer}', tostring(layer)):gsub('{feature}', tostring(feature)))
  end
end

local function check_opts(opts)
  opts = options.check(opts, {'node_threshold', 'edge_threshold', 'title', 'tokenizer', 'feature_url', 'max_nodes'}, WHERE, 3)
  local o = {node_threshold = prune.threshold(opts.node_threshold, 'node_threshold', 0.8, WHERE, 3),
    edge_threshold = prune.threshold(opts.edge_threshold, 'edge_threshold', 0.98, WHERE, 3), url = url_maker(opts.feature_url),
    max_nodes = options.whole(opts.max_nodes, 'max_nodes', WHERE, 500, 1, 4), title = opts.title, tokenizer = opts.tokenizer}
  if o.title ~= nil and type(o.title) ~= 'string' then error(('%s: title must be a string, got %s'):format(WHERE, type(o.title)), 3) end
  local tok = o.tokenizer
  if tok ~= nil and (type(tok) ~= 'table' or type(tok.decode) ~= 'function') then
    error(('%s: tokenizer must be a tokenizer (data.tokenizer: one with tok:decode(ids)), got %s'):format(WHERE, type(tok)), 3)
  end
  return o
end

-- Each node's text: the tokenizer's, or the token id where there is none
local function token_text(tok)
  if not tok then return function(id) return '#' .. id end end
  return function(id)
    local ok, s = pcall(tok.decode, tok, {id})
    if not ok or type(s) ~= 'string' then error(('%s: the tokenizer could not decode token id %d: %s'):format(WHERE, id, tostring(s)), 0) end
    return s
  end
end

-- M.data(g, o) -> {nodes (the kept ones: the logits by probability, then the rest by influence), edges (the kept ones
-- between drawn nodes), counts, scores}: what the chart and the table both draw
function M.data(g, o)
  local A = g.adjacency_matrix:float():cpu()
  local N, L, T = A:size(1), g.n_layers, g.n_pos
  local K, n = g.logit_tokens:size(1), g.selected_features:size(1)
  local p = prune.prune_graph(g, {node_threshold = o.node_threshold, edge_threshold = o.edge_threshold})
  local replacement, completeness = prune.graph_scores(g)
  -- a node's share of the total influence: its cumulative score less the one before it in their order
  local sorted, order = p.cumulative_scores:sort()
  local share = torch.zeros({N}, {device = 'cpu'}):scatter(1, order,
    sorted - torch.cat({torch.zeros({1}, {device = 'cpu'}), sorted:narrow(1, 1, N - 1)}))
  local cum, shares, kept = p.cumulative_scores:tolist(), share:tolist(), p.node_mask:tolist()
  local text = token_text(o.tokenizer or (g.model and rawget(g.model, 'tokenizer')))
  local ids = g.input_tokens:view(-1):tolist()
  local tokens = {}
  for i, id in ipairs(ids) do tokens[i] = text(id) end
  local active, acts = g.active_features:tolist(), g.activation_values:tolist()
  local selected = g.selected_features:tolist()
  local nodes, logits = {}, {}
  local counts = {feature = 0, error = 0, token = 0, logit = 0, features = n, errors = L * T}
  for i = 1, N do
    if kept[i] then
      local node = {id = i, influence = shares[i], cumulative = cum[i]}
      if i <= n then
        local a = selected[i]
        node.kind, node.layer, node.pos, node.feature, node.activation = 'feature', active[a][1], active[a][2], active[a][3], acts[a]
        if o.url then node.url = o.url(node.layer, node.feature) end
      elseif i <= n + L * T then
        local e = i - n - 1
        node.kind, node.layer, node.pos = 'error', math.floor(e / T) + 1, e % T + 1
      elseif i <= n + (L + 1) * T then
        node.kind, node.pos = 'token', i - n - L * T
        node.token_id, node.token, node.drawn = ids[node.pos], tokens[node.pos], true
      else
        local k = i - n - (L + 1) * T
        node.kind, node.pos, node.drawn = 'logit', T, true
        node.token_id, node.probability = g.logit_tokens[k]:item(), g.logit_probabilities[k]:item()
        node.token = text(node.token_id)
      end
      node.at_token = tokens[node.pos]
      counts[node.kind] = counts[node.kind] + 1
      if node.kind == 'logit' then logits[#logits + 1] = node else nodes[#nodes + 1] = node end
    end
  end
  table.sort(nodes, function(a, b) return a.cumulative < b.cumulative or (a.cumulative == b.cumulative and a.id < b.id) end)
  table.sort(logits, function(a, b) return a.probability > b.probability end)
  local drawn_ids, budget = {}, o.max_nodes
  for _, node in ipairs(nodes) do  -- the most influential features and errors, up to max_nodes
    if not node.drawn and budget > 0 then node.drawn, budget = true, budget - 1 end
    if node.drawn then drawn_ids[#drawn_ids + 1] = node.id end
  end
  for i = #logits, 1, -1 do table.insert(nodes, 1, logits[i]) end
  for _, l in ipairs(logits) do drawn_ids[#drawn_ids + 1] = l.id end
  -- the kept edges between drawn nodes: rows targets, columns sources
  table.sort(drawn_ids)
  local idx = torch.tensor(drawn_ids):long():cpu()
  local D = #drawn_ids
  local mask = p.edge_mask:index_select(1, idx):index_select(2, idx)
  local weights = A:index_select(1, idx):index_select(2, idx):masked_select(mask):tolist()
  local targets = idx:view(-1, 1):expand(D, D):masked_select(mask):tolist()
  local sources = idx:view(1, -1):expand(D, D):masked_select(mask):tolist()
  local edges = {}
  for i, w in ipairs(weights) do edges[i] = {source = sources[i], target = targets[i], weight = w} end
  counts.nodes, counts.kept = N, #nodes
  counts.edges, counts.kept_edges, counts.drawn = A:ne(0):sum():item(), p.edge_mask:sum():item(), D
  return {nodes = nodes, edges = edges, n_layers = L, n_pos = T, tokens = tokens, counts = counts, replacement = replacement,
    completeness = completeness, prune = p}
end

local function summary(d, o)
  local c = d.counts
  local prompt = {}
  for i, t in ipairs(d.tokens) do prompt[i] = esc(attribution.visible(t)) end
  local cut = c.feature + c.error > o.max_nodes
  local lines = {
    ('<b>Prompt</b> (%d tokens): <code style="white-space:pre-wrap">%s</code>'):format(d.n_pos,
      table.concat(prompt, '<span style="color:#bbb">|</span>')),
    ('<b>Pruned</b> (sae.prune_graph, node_threshold %s, edge_threshold %s): kept <b>%s of %s nodes</b> (%s of %s feature nodes, '
      .. '%s of %s error nodes, %d tokens, %d logits) and <b>%s of %s edges</b>.'):format(tostring(o.node_threshold),
      tostring(o.edge_threshold), format.count(c.kept), format.count(c.nodes), format.count(c.feature), format.count(c.features),
      format.count(c.error), format.count(c.errors), c.token, c.logit, format.count(c.kept_edges), format.count(c.edges)),
    ('<b>Replacement score %.4f</b>, <b>completeness score %.4f</b> (sae.graph_scores, of the whole graph).'):format(d.replacement,
      d.completeness),
  }
  if cut then
    lines[#lines + 1] = ('<span class="warning">Drawn: the %s most influential of the %s kept feature and error nodes '
      .. '(max_nodes = %d), every token and logit, and the %s kept edges between drawn nodes; the table lists every kept node, '
      .. 'the ones not drawn in grey.</span>'):format(format.count(o.max_nodes), format.count(c.feature + c.error), o.max_nodes,
      format.count(#d.edges))
  end
  lines[#lines + 1] = 'Layers, positions, feature indices and token ids count from 1, as anatomy\'s (circuit-tracer\'s and '
    .. 'Neuronpedia\'s are these less 1). <i>influence</i>: the node\'s share of the total influence on the logits '
    .. '(wÂ + wÂ² + …, graphs.md); <i>cumulative</i>: the share of the nodes at least as influential (circuit-tracer\'s '
    .. 'cumulative_scores, the influence its graph files hold); the logits first, by probability, then every kept node by '
    .. 'influence. Hover a node for its details; click it (or its row) to show its edges' .. (o.url and ', again to open its feature page.' or '.')
  return '<p class="summary">' .. table.concat(lines, '<br>') .. '</p>'
end

-- M.html(g, opts) -> the page (opts as g:report's)
function M.html(g, o)
  local d = M.data(g, o)
  local chart, drawn_edges = attribution.chart(d)
  local rec = provenance.record{model = g.model}
  local extra = {{'transcoders', tostring(g.transcoders)}, {'graph', tostring(g)}}
  local body = table.concat({'<style>', attribution.style, '</style>', page.provenance(rec, extra), summary(d, o),
    attribution.legend(), '<div class="graphpage"><div class="graphchart">', chart, '</div><div class="graphtable">',
    ('<p class="note">%d kept nodes, %d edges drawn</p>'):format(#d.nodes, drawn_edges), attribution.table(d), '</div></div>',
    '<script>', attribution.script, '</script>'})
  local title = o.title
  if not title then
    local last = {}
    for i = math.max(1, d.n_pos - 7), d.n_pos do last[#last + 1] = d.tokens[i] end
    title = 'Attribution graph: ' .. (d.n_pos > 8 and '…' or '') .. attribution.visible(table.concat(last))
  end
  return page.new(title, body), d
end

-- M.report(g, path, opts) -> path: g:report's (Graph.lua)
function M.report(g, path, opts)
  if type(g) ~= 'table' or not torch.is_tensor(g.adjacency_matrix) then
    error(('%s: graph must be what sae.attribute returns, got %s'):format(WHERE, type(g)), 2)
  end
  if type(path) ~= 'string' or path == '' then error(('%s: path must be a file path, got %s'):format(WHERE, type(path)), 2) end
  local o = check_opts(opts)
  local html = M.html(g, o)
  fs.write_atomic(path, html)
  return path
end

return M
