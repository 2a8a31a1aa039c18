-- sae.Graph: what sae.attribute returns, an attribution graph of one prompt
-- (features/graph.lua builds it; docs/graphs.md). Its fields are
-- circuit-tracer's (adjacency_matrix, active_features, activation_values,
-- selected_features, logit_tokens, logit_probabilities, input_tokens,
-- n_layers, n_pos), every index from 1; it keeps the model and transcoders
-- it was built from (g.model, g.transcoders) for the methods that rerun
-- them. Each method lives in its own file:
--   g:prune(opts), g:scores()        graph_prune.lua
--   g:json(path, opts)               graph_json.lua
--   g:report(path, opts)             graph_report.lua
--   g:qk(layer, head, opts)          graph_qk.lua
--   g:ablate(features, opts), g:steer(interventions, opts)   graph_intervene.lua
local torch = require('anatomy.torch')
local Graph = {__typename = 'sae.Graph'}

-- g.adjacency_matrix (N, N) is made from its nonzero rows, g.adjacency_rows (the feature nodes', then the logits'; N
-- columns), when it is first read: dense, it grows with the square of the tokens (46 GB at 8k; docs/graphs.md, Memory)
function Graph.__index(g, k)
  local R = k == 'adjacency_matrix' and rawget(g, 'adjacency_rows')
  if not R then return Graph[k] end
  local N, f, K = R:size(2), g.selected_features:size(1), g.logit_tokens:size(1)
  local A = torch.zeros({N, N}, {device = 'cpu'})
  if f > 0 then A:narrow(1, 1, f):copy_(R:narrow(1, 1, f)) end
  A:narrow(1, N - K + 1, K):copy_(R:narrow(1, f + 1, K))
  rawset(g, 'adjacency_matrix', A)
  return A
end

-- Graph.new(fields) -> graph: fields as sae.attribute fills them
function Graph.new(fields)
  return setmetatable(fields, Graph)
end

function Graph:__tostring()
  local n = self.active_features:size(1)
  return ('sae.Graph(%d positions, %d layers, %d active features, %d feature nodes, %d logits, %d nodes)'):format(
    self.n_pos, self.n_layers, n, self.selected_features:size(1), self.logit_tokens:size(1),
    (rawget(self, 'adjacency_rows') or self.adjacency_matrix):size(2))
end

-- g:prune({node_threshold = 0.8, edge_threshold = 0.98}) -> {node_mask, edge_mask, cumulative_scores}: sae.prune_graph(g, opts)
function Graph:prune(opts)
  return require('anatomy.features.graph_prune').prune_graph(self, opts)
end

-- g:scores() -> replacement, completeness: sae.graph_scores(g)
function Graph:scores()
  return require('anatomy.features.graph_prune').graph_scores(self)
end

-- g:json(path, {slug, scan, node_threshold = 0.8, edge_threshold = 0.98, tokenizer}) -> file: circuit-tracer's graph files (graph_json.lua)
function Graph:json(path, opts) return require('anatomy.features.graph_json').json(self, path, opts) end

-- g:report(path, opts) -> path: the pruned graph as a self-contained HTML page (graph_report.lua, its options there)
function Graph:report(path, opts) return require('anatomy.features.graph_report').report(self, path, opts) end

-- g:ablate(features, opts) -> result: the features set to 0 and the model rerun (graph_intervene.lua)
function Graph:ablate(features, opts) local r = require('anatomy.features.graph_intervene').ablate(self, features, opts); return r end

-- g:steer(interventions, opts) -> result: features set to a value or scaled, the model rerun (graph_intervene.lua)
function Graph:steer(interventions, opts) local r = require('anatomy.features.graph_intervene').steer(self, interventions, opts); return r end

-- g:qk(layer, head, {query_pos, key_pos, top_k = 20}) -> sae.QK: a head's score split over the sources' pairs (graph_qk.lua)
function Graph:qk(layer, head, opts) local r = require('anatomy.features.graph_qk').qk(self, layer, head, opts); return r end

return Graph
