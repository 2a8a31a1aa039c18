-- g:json: an attribution graph written as circuit-tracer's graph files
-- (<slug>.json, graph-metadata.json) for a tiny GPT-2 with a CLT: the file's
-- nodes and links are the pruned graph's, with circuit-tracer's indices
-- (from 0), the metadata lists each slug once, bad options are errors naming
-- the argument, and a write that fails leaves no partial file. The same file
-- as circuit-tracer's create_graph_files: tests/parity/test_graph_json_parity.py.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, raises, raises_part = H.test, H.eq, H.raises, H.raises_part
local pretrained = require('anatomy.models.pretrained')
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')

local V = 24
local ids = {24, 5, 9, 2, 17, 9, 3}

-- a byte-level BPE of the letters a.. and <|endoftext|> last (id V, from 1)
local function tokenizer()
  local vocab = {}
  for i = 0, V - 2 do vocab[string.char(97 + i)] = i end
  local dir = H.tmpdir()
  fs.write_atomic(dir .. '/tokenizer.json', json.encode({version = '1.0', normalizer = json.null, post_processor = json.null,
    added_tokens = {{id = V - 1, content = '<|endoftext|>', special = true, lstrip = false, rstrip = false,
      single_word = false, normalized = false}},
    pre_tokenizer = {type = 'ByteLevel', add_prefix_space = false, trim_offsets = true, use_regex = true},
    decoder = {type = 'ByteLevel'}, model = {type = 'BPE', dropout = json.null, vocab = vocab, merges = {}}}))
  return require('anatomy.data').tokenizer(dir)
end

local function graph()
  local F = require(pretrained.families.gpt2)
  torch.manual_seed(1)
  local m = F.build(F.check({model_type = 'gpt2', vocab_size = V, n_positions = 16, n_embd = 16, n_layer = 3, n_head = 4}, 'test'))
  torch.no_grad(function()
    for _, p in ipairs(m:parameters()) do p:add_(torch.randn(p:size()) * 0.2) end
  end)
  m:eval()
  local c = H.randomize_transcoders(sae.clt{n_layers = 3, d_model = 16, d_transcoder = 10, kind = 'jumprelu',
    input_hook = 'mlp.hook_in', output_hook = 'mlp.hook_out'}, 7)
  rawset(m, 'tokenizer', tokenizer())  -- as models.from_pretrained sets it
  return sae.attribute(m, c, ids, {max_n_logits = 4, desired_logit_prob = 0.99})
end

local g = graph()
local function read(path) return json.decode(fs.read(path)) end

test("the file's nodes and links are the pruned graph's, its indices circuit-tracer's (from 0)", function()
  local dir = H.tmpdir() .. '/graphs'  -- made as create_graph_files makes output_path
  local file = g:json(dir, {slug = 'tiny-gpt2', scan = 'tiny'})
  eq(file, dir .. '/tiny-gpt2.json', 'the graph file')
  local doc = read(file)
  local p = g:prune()
  local N, K, T, n = g.adjacency_matrix:size(1), g.logit_tokens:size(1), g.n_pos, g.selected_features:size(1)
  eq(#doc.nodes, p.node_mask:sum():item(), 'a node for each kept node')
  eq(#doc.links, p.edge_mask:sum():item(), 'a link for each kept edge')
  assert(#doc.links > 20 and #doc.nodes < N, ('a pruned graph with edges: %d nodes of %d, %d links'):format(#doc.nodes, N, #doc.links))
  local by_id, kinds = {}, {}
  for _, v in ipairs(doc.nodes) do by_id[v.node_id], kinds[v.feature_type] = v, (kinds[v.feature_type] or 0) + 1 end
  eq(kinds.embedding, T, 'every token')
  eq(kinds.logit, K, 'every logit')
  assert((kinds['cross layer transcoder'] or 0) > 0 and (kinds['mlp reconstruction error'] or 0) > 0, 'features and errors kept')
  -- every link's weight is its edge's, found from its node ids
  local index = {}
  local active, sel = g.active_features:tolist(), g.selected_features:tolist()
  for i = 1, n do
    local a = active[sel[i]]
    index[('%d_%d_%d'):format(a[1] - 1, a[3] - 1, a[2] - 1)] = i
  end
  for l = 0, g.n_layers - 1 do for pos = 0, T - 1 do index[('0_%d_%d'):format(l, pos)] = n + l * T + pos + 1 end end
  for pos = 0, T - 1 do index[('E_%d_%d'):format(ids[pos + 1] - 1, pos)] = n + g.n_layers * T + pos + 1 end
  local logits = g.logit_tokens:tolist()
  for k = 1, K do index[('%d_%d_%d'):format(g.n_layers + 1, logits[k] - 1, T - 1)] = N - K + k end
  local worst = 0
  for _, e in ipairs(doc.links) do
    local s, t = index[e.source], index[e.target]
    assert(s and t and by_id[e.source] and by_id[e.target], 'a link between written nodes: ' .. e.source .. ' -> ' .. e.target)
    assert(p.edge_mask[t][s]:item(), 'a kept edge')
    worst = math.max(worst, math.abs(e.weight - g.adjacency_matrix[t][s]:item()))
  end
  eq(worst, 0, 'the weights, as the adjacency matrix holds them')
  local first = by_id[('%d_%d_%d'):format(g.n_layers + 1, logits[1] - 1, T - 1)]
  eq({first.is_target_logit, first.feature, first.ctx_idx, first.jsNodeId, first.layer},
    {true, logits[1] - 1, T - 1, ('L_%d-%d'):format(logits[1] - 1, T - 1), tostring(g.n_layers + 1)}, 'the top logit')
  eq(first.clerp, ('Output "%s" (p=%.3f)'):format(string.char(96 + logits[1]), g.logit_probabilities[1]:item()), 'its label')
  eq(first.influence, json.null, 'a logit has no influence, as circuit-tracer writes it')
  local tok = by_id[('E_%d_0'):format(V - 1)]
  eq({tok.feature, tok.layer, tok.jsNodeId, tok.activation}, {0, 'E', ('E_%d-0'):format(V - 1), json.null}, 'the BOS token')
  eq(doc.metadata.prompt_tokens, {'<|endoftext|>', 'e', 'i', 'b', 'q', 'i', 'c'}, 'the prompt, token by token')
  eq({doc.metadata.prompt, doc.metadata.slug, doc.metadata.scan, doc.metadata.node_threshold, doc.metadata.schema_version},
    {'<|endoftext|>eibqic', 'tiny-gpt2', 'tiny', 0.8, 1}, 'the metadata')
  eq(read(dir .. '/graph-metadata.json').graphs, {doc.metadata}, "graph-metadata.json: the graph's metadata")
end)

test('graph-metadata.json lists each slug once; lower thresholds keep fewer nodes; a scan list is named by a hash',
function()
  local dir = H.tmpdir()
  eq(g:json(dir .. '/', {slug = 'a', scan = 'tiny'}), dir .. '/a.json', 'a folder named with its slash')
  local full = read(dir .. '/a.json')
  local small = read(g:json(dir, {slug = 'b', scan = {'tc-0', 'tc-1'}, node_threshold = 0.5, edge_threshold = 0.9}))
  assert(#small.nodes < #full.nodes and #small.links < #full.links,
    ('%d nodes, %d links against %d, %d'):format(#small.nodes, #small.links, #full.nodes, #full.links))
  eq(small.metadata.transcoder_list, {'tc-0', 'tc-1'}, 'the transcoders listed')
  assert(small.metadata.scan:match('^custom%-%d+$'), 'a custom scan: ' .. small.metadata.scan)
  eq(read(g:json(dir, {slug = 'c', scan = {'tc-0', 'tc-1'}})).metadata.scan, small.metadata.scan, 'the same name for the same list')
  g:json(dir, {slug = 'a', scan = 'other'})
  local slugs = {}
  for _, m in ipairs(read(dir .. '/graph-metadata.json').graphs) do slugs[#slugs + 1] = m.slug .. ':' .. m.scan end
  eq(slugs, {'b:' .. small.metadata.scan, 'c:' .. small.metadata.scan, 'a:other'}, "a slug written again replaces its entry")
  eq(fs.list(dir), {'a.json', 'b.json', 'c.json', 'graph-metadata.json'}, 'the folder')
end)

test('bad options are errors naming the argument', function()
  local dir = H.tmpdir()
  raises(function() g:json(dir, {slug = 'x', scan = 's', node_treshold = 0.5}) end,
    "g:json: unknown option 'node_treshold', did you mean 'node_threshold'? (expected edge_threshold, node_threshold, scan, slug, tokenizer)")
  raises_part(function() g:json(dir, {scan = 's'}) end, "g:json: slug must name the graph with letters, digits, '.', '_' and '-' (the file is <slug>.json), got nil")
  raises_part(function() g:json(dir, {slug = '../x', scan = 's'}) end, "got '../x'")
  raises_part(function() g:json(dir, {slug = 'x'}) end, "g:json: option 'scan' is required")
  raises(function() g:json(dir, {slug = 'x', scan = 3}) end, 'g:json: scan must be a string or a list of strings, got number')
  raises(function() g:json(dir, {slug = 'x', scan = {'a', ''}}) end, 'g:json: scan[2] must be a transcoder name (a string), got ')
  raises(function() g:json(dir, {slug = 'x', scan = 's', node_threshold = 1.5}) end, 'g:json: node_threshold must be a number in [0, 1], got 1.5')
  raises(function() g:json(dir, {slug = 'x', scan = 's', edge_threshold = 0 / 0}) end, 'g:json: edge_threshold must be a number in [0, 1], got nan')
  raises(function() g:json(nil, {slug = 'x', scan = 's'}) end, 'g:json: path must be the folder to write the graph files in (a string), got nil')
  local file = H.tmpfile('x')
  raises_part(function() g:json(file, {slug = 'x', scan = 's'}) end, "g:json: path '" .. file .. "' is a file")
  raises(function() g:json(dir, {slug = 'x', scan = 's', tokenizer = 5}) end, 'g:json: tokenizer must be a data.Tokenizer (or the path of its files), got number')
  local tok = rawget(g.model, 'tokenizer')
  rawset(g.model, 'tokenizer', nil)
  local ok, err = pcall(function() g:json(dir, {slug = 'x', scan = 's'}) end)
  rawset(g.model, 'tokenizer', tok)
  assert(not ok and err:find("give one with the option 'tokenizer'", 1, true), tostring(err))
  assert(err:find('test_graph_json.lua', 1, true), "the error points at the caller's line: " .. err)
  eq(fs.list(dir), {}, 'nothing written')
  eq(read(g:json(dir, {slug = 'x', scan = 's', tokenizer = tok})).metadata.prompt_tokens[2], 'e', 'the tokenizer given')
end)

test('a write that fails leaves no partial file: the graph-metadata.json it cannot read, a folder in the way', function()
  local dir = H.tmpdir()
  fs.write_atomic(dir .. '/graph-metadata.json', '{"graphs": [')
  raises_part(function() g:json(dir, {slug = 'x', scan = 's'}) end,
    "g:json: '" .. dir .. "/graph-metadata.json' is not a graph-metadata.json")
  eq(fs.list(dir), {'graph-metadata.json'}, 'no graph file written')
  eq(fs.read(dir .. '/graph-metadata.json'), '{"graphs": [', 'graph-metadata.json as it was')
  local dir2 = H.tmpdir()
  g:json(dir2, {slug = 'x', scan = 's'})
  local before = fs.read(dir2 .. '/graph-metadata.json')
  fs.mkdir(dir2 .. '/y.json')  -- the file y.json cannot be renamed into place
  raises_part(function() g:json(dir2, {slug = 'y', scan = 's'}) end, 'y.json')
  eq(fs.read(dir2 .. '/graph-metadata.json'), before, 'graph-metadata.json does not list the graph that failed')
  eq(fs.list(dir2), {'graph-metadata.json', 'x.json', 'y.json'}, 'no temporary file left')
  assert(fs.is_dir(dir2 .. '/y.json'), 'the folder in the way untouched')
end)

H.done()
