-- g:json(path, opts): an attribution graph as circuit-tracer 0.5.0's graph
-- files (its utils/create_graph_files.py, frontend/graph_models.py), which
-- Neuronpedia's graph viewer and circuit-tracer's local server open: the
-- pruned graph in <slug>.json, and its metadata in the folder's
-- graph-metadata.json. Indices in the files count from 0, as circuit-tracer's.
local torch = require('anatomy.torch')
local options = require('anatomy.torch.options')
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')
local data = require('anatomy.data')
local graph_prune = require('anatomy.features.graph_prune')

local M = {}
local WHERE = 'g:json'

-- circuit-tracer's feature number: the Cantor pairing of (layer, feature)
local function cantor(x, y) return (x + y) * (x + y + 1) / 2 + y end

local function finite(v, what)
  if v ~= v or v == math.huge or v == -math.huge then
    error(('%s: %s is %s; a graph file has no word for it'):format(WHERE, what, tostring(v)), 4)
  end
  return v
end

-- A node as graph_models.Node writes it; the fields each kind leaves at their defaults
local function node(f)
  f.token_prob, f.is_target_logit, f.run_idx, f.reverse_ctx_idx = f.token_prob or 0, f.is_target_logit or false, 0, 0
  f.clerp = f.clerp or ''
  f.influence, f.activation = f.influence or json.null, f.activation or json.null
  return f
end

local function check_scan(scan)
  local function name(s) return type(s) == 'string' and s ~= '' end
  if name(scan) then return scan, {} end
  if type(scan) == 'table' and #scan > 0 then
    for i = 1, #scan do
      if not name(scan[i]) then error(('%s: scan[%d] must be a transcoder name (a string), got %s'):format(WHERE, i, tostring(scan[i])), 3) end
    end
    -- circuit-tracer names a list 'custom-' .. hash('-'.join(list)), Python's salted per-process hash; this
    -- one is the same for the same list in every run
    local joined, h = table.concat(scan, '-'), 0
    for i = 1, #joined do h = (h * 31 + joined:byte(i)) % 2147483647 end
    return 'custom-' .. ('%d'):format(h), scan
  end
  if scan == nil then
    error(("%s: option 'scan' is required: the transcoders' name on Neuronpedia (circuit-tracer's scan, "
      .. "e.g. 'gemma-2-2b'), or a list of their names"):format(WHERE), 3)
  end
  error(('%s: scan must be a string or a list of strings, got %s'):format(WHERE, type(scan)), 3)
end

local function check_tokenizer(g, tok)
  if tok == nil then
    tok = type(g.model) == 'table' and rawget(g.model, 'tokenizer') or nil
    if tok == nil then
      error(("%s: the graph's model has no tokenizer; give one with the option 'tokenizer' (a data.Tokenizer or "
        .. 'the path or Hub id of its files): the file names each token by its text'):format(WHERE), 3)
    end
  elseif type(tok) == 'string' then
    local ok, t = pcall(data.tokenizer, tok)
    if not ok then error(('%s: tokenizer: %s'):format(WHERE, tostring(t)), 3) end
    tok = t
  end
  if type(tok) ~= 'table' or type(tok.decode) ~= 'function' then
    error(('%s: tokenizer must be a data.Tokenizer (or the path of its files), got %s'):format(WHERE, type(tok)), 3)
  end
  return tok
end

-- The kept nodes as create_nodes makes them, by node index (from 1)
local function make_nodes(g, kept, scores, tok)
  local n, L, T = g.selected_features:size(1), g.n_layers, g.n_pos
  local errors_end, tokens_end = n + L * T, n + L * T + T
  local sel, active, act = g.selected_features:tolist(), g.active_features:tolist(), g.activation_values:tolist()
  local input, logits, probs = g.input_tokens:tolist(), g.logit_tokens:tolist(), g.logit_probabilities:tolist()
  local nodes = {}
  for _, i in ipairs(kept) do
    local influence = finite(scores[i], ('node %d\'s influence'):format(i))
    if i <= n then
      local layer, pos, feat = active[sel[i]][1] - 1, active[sel[i]][2] - 1, active[sel[i]][3] - 1
      nodes[i] = node{node_id = ('%d_%d_%d'):format(layer, feat, pos), feature = cantor(layer, feat),
        layer = tostring(layer), ctx_idx = pos, feature_type = 'cross layer transcoder',
        jsNodeId = ('%d_%d-0'):format(layer, feat), influence = influence,
        activation = finite(act[sel[i]], ('feature node %d\'s activation'):format(i))}
    elseif i <= errors_end then
      local layer, pos = math.floor((i - n - 1) / T), (i - n - 1) % T
      nodes[i] = node{node_id = ('0_%d_%d'):format(layer, pos), feature = -1, layer = tostring(layer), ctx_idx = pos,
        feature_type = 'mlp reconstruction error', jsNodeId = ('%d_%d-0'):format(layer, pos), influence = influence}
    elseif i <= tokens_end then
      local pos = i - errors_end - 1
      local id = input[pos + 1] - 1
      nodes[i] = node{node_id = ('E_%d_%d'):format(id, pos), feature = pos, layer = 'E', ctx_idx = pos,
        feature_type = 'embedding', jsNodeId = ('E_%d-%d'):format(id, pos), influence = influence}
    else  -- a logit: circuit-tracer gives it no influence
      local k = i - tokens_end
      local id, p, layer = logits[k] - 1, finite(probs[k], ('logit %d\'s probability'):format(k)), tostring(L + 1)
      nodes[i] = node{node_id = ('%s_%d_%d'):format(layer, id, T - 1), feature = id, layer = layer, ctx_idx = T - 1,
        feature_type = 'logit', token_prob = p, is_target_logit = k == 1, jsNodeId = ('L_%d-%d'):format(id, T - 1),
        clerp = ('Output "%s" (p=%.3f)'):format(tok:decode({logits[k]}), p)}
    end
  end
  return nodes
end

-- create_used_nodes_and_edges: the kept edges between kept nodes (targets' rows in order, sources within), and the
-- nodes they touch, with every token and logit
local function used(g, kept, nodes, edge_mask)
  local A, N = g.adjacency_matrix:float():cpu(), g.adjacency_matrix:size(1)
  local index = torch.arange(1, N + 1):cpu()  -- the masks are on the CPU, whatever the default device
  local links, connected = {}, {}
  for _, dst in ipairs(kept) do
    local row = edge_mask[dst]
    if row:any():item() then
      local srcs, weights = index:masked_select(row):tolist(), A[dst]:masked_select(row):tolist()
      for j, src in ipairs(srcs) do
        if nodes[src] then
          local s, t = nodes[src].node_id, nodes[dst].node_id
          links[#links + 1] = {source = s, target = t,
            weight = finite(weights[j], ('the edge %d -> %d\'s weight'):format(src, dst))}
          connected[s], connected[t] = true, true
        end
      end
    end
  end
  local list = {}
  for _, i in ipairs(kept) do
    local v = nodes[i]
    if connected[v.node_id] or v.feature_type == 'embedding' or v.feature_type == 'logit' then list[#list + 1] = v end
  end
  return list, links
end

-- add_graph_metadata: the folder's graph-metadata.json, its entry for this slug replaced
local function metadata_text(file, meta)
  local doc = {graphs = {}}
  if fs.exists(file) then
    local ok, d = pcall(json.decode, fs.read(file))
    if not ok or type(d) ~= 'table' or type(d.graphs) ~= 'table' then
      error(("%s: '%s' is not a graph-metadata.json ({\"graphs\": [...]})%s; nothing was written"):format(WHERE, file,
        ok and '' or ' (' .. tostring(d) .. ')'), 3)
    end
    doc = d
  end
  local graphs = {}
  for i, entry in ipairs(doc.graphs) do
    if type(entry) ~= 'table' then
      error(("%s: '%s': graphs[%d] is not an object; nothing was written"):format(WHERE, file, i), 3)
    end
    if entry.slug ~= meta.slug then graphs[#graphs + 1] = entry end
  end
  graphs[#graphs + 1] = meta
  doc.graphs = graphs
  return json.encode(doc) .. '\n'
end

-- sae.Graph:json(path, {slug, scan, node_threshold = 0.8, edge_threshold = 0.98, tokenizer}) -> the graph file's
-- path: circuit-tracer's create_graph_files(graph, slug, path, scan, node_threshold, edge_threshold). path is the
-- folder (made when missing) that gets <slug>.json and graph-metadata.json; scan names the transcoders on Neuronpedia.
function M.json(g, path, opts)
  opts = options.check(opts, {'slug', 'scan', 'node_threshold', 'edge_threshold', 'tokenizer'}, WHERE, 2)
  if type(path) ~= 'string' or path == '' then
    error(('%s: path must be the folder to write the graph files in (a string), got %s'):format(WHERE, type(path)), 2)
  end
  path = path:match('^(.-)/*$') ~= '' and path:match('^(.-)/*$') or path  -- 'graphs/' writes graphs/<slug>.json
  if fs.exists(path) and not fs.is_dir(path) then
    error(("%s: path '%s' is a file; it must be the folder that gets <slug>.json and graph-metadata.json"):format(WHERE, path), 2)
  end
  local slug = opts.slug
  if type(slug) ~= 'string' or not slug:match('^[%w_-][%w._-]*$') then
    error(("%s: slug must name the graph with letters, digits, '.', '_' and '-' (the file is <slug>.json), got %s"):format(
      WHERE, type(slug) == 'string' and ("'" .. slug .. "'") or tostring(slug)), 2)
  end
  local scan, transcoder_list = check_scan(opts.scan)
  local node_threshold = graph_prune.threshold(opts.node_threshold, 'node_threshold', 0.8, WHERE, 2)
  local edge_threshold = graph_prune.threshold(opts.edge_threshold, 'edge_threshold', 0.98, WHERE, 2)
  local tok = check_tokenizer(g, opts.tokenizer)
  local pruned = graph_prune.prune_graph(g, {node_threshold = node_threshold, edge_threshold = edge_threshold})
  local N = g.adjacency_matrix:size(1)
  local kept = torch.arange(1, N + 1):cpu():masked_select(pruned.node_mask):tolist()
  local nodes = make_nodes(g, kept, pruned.cumulative_scores:tolist(), tok)
  local used_nodes, links = used(g, kept, nodes, pruned.edge_mask)
  local prompt_tokens = {}
  for i, id in ipairs(g.input_tokens:tolist()) do prompt_tokens[i] = tok:decode({id}) end
  local meta = {slug = slug, scan = scan, transcoder_list = transcoder_list, prompt_tokens = prompt_tokens,
    prompt = tok:decode(g.input_tokens:tolist()), node_threshold = node_threshold, schema_version = 1}
  local text = json.encode({metadata = meta, nodes = used_nodes, links = links,
    qParams = {pinnedIds = {}, supernodes = {}, linkType = 'both', clickedId = '', sg_pos = ''}}) .. '\n'
  local ok, err = pcall(fs.mkdir, path)
  if not ok then error(('%s: path: %s'):format(WHERE, tostring(err)), 2) end
  local meta_file, file = path .. '/graph-metadata.json', path .. '/' .. slug .. '.json'
  local meta_text = metadata_text(meta_file, meta)  -- read and checked before either file is written
  -- each file is written whole or not at all (a temporary file renamed into place); the graph first, so that
  -- graph-metadata.json never lists a graph that is not there
  for _, w in ipairs{{file, text}, {meta_file, meta_text}} do
    ok, err = pcall(fs.write_atomic, w[1], w[2])
    if not ok then error(('%s: %s'):format(WHERE, tostring(err)), 2) end
  end
  return file
end

return M
