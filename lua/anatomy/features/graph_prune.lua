-- Pruning an attribution graph and scoring it, as circuit-tracer 0.5.0's
-- prune_graph and compute_graph_scores do (its graph.py), on the graph
-- sae.attribute returns. A node's influence is its share in the logits
-- through every path: with Â the adjacency matrix's absolute values, each
-- row divided by its sum, and w the logits' probabilities (zero elsewhere),
-- influence = w Â + w Â² + ... (the series stops where a power is zero: the
-- graph has no cycles). N nodes, K logits, T tokens, n features.
local torch = require('anatomy.torch')
local options = require('anatomy.torch.options')

local M = {}

local function check_graph(g, where, level)
  if type(g) ~= 'table' or not torch.is_tensor(g.adjacency_matrix) or not torch.is_tensor(g.logit_probabilities) then
    error(('%s: graph must be what sae.attribute returns, got %s'):format(where, type(g)), level + 1)
  end
end

local function normalize(A)
  local abs = A:abs()
  return abs / abs:sum(2, true):clamp_min(1e-10)
end

-- w Â + w Â² + ... until a power is zero (at most max_iter terms)
local function influence(A, w, where)
  local current = w:view(1, -1):matmul(A):view(-1)
  local total = current
  local steps = 0
  while current:ne(0):any():item() do
    if steps >= 1000 then error(('%s: the influence did not converge after 1000 steps (a cycle in the graph?)'):format(where), 3) end
    current = current:view(1, -1):matmul(A):view(-1)
    total = total + current
    steps = steps + 1
  end
  return total
end

local function logit_weights(g)
  local N, K = g.adjacency_matrix:size(1), g.logit_probabilities:size(1)
  local w = torch.zeros({N}, {device = 'cpu'})
  w:narrow(1, N - K + 1, K):copy_(g.logit_probabilities:float():cpu())
  return w
end

-- the score that keeps `threshold` of the total: the sorted scores'
-- cumulative share, the first place it reaches the threshold
local function find_threshold(scores, threshold)
  local sorted = scores:sort(1, true)
  local cum = sorted:cumsum(1) / sorted:sum()
  local at = math.min(cum:lt(threshold):sum():item() + 1, sorted:size(1))
  return sorted[at]:item()
end

-- M.threshold(v, name, default, where, level) -> v (default when nil): a
-- pruning threshold, a number in [0, 1], else an error naming it at `level`
-- counted from the caller (1: the caller's own line); g:json and g:report
-- check theirs with it too
function M.threshold(v, name, default, where, level)
  if v == nil then return default end
  if type(v) ~= 'number' or v ~= v or v < 0 or v > 1 then
    error(('%s: %s must be a number in [0, 1], got %s'):format(where, name, tostring(v)), level + 1)
  end
  return v
end

-- sae.prune_graph(graph, {node_threshold = 0.8, edge_threshold = 0.98}) -> {node_mask (N), edge_mask (N, N),
-- cumulative_scores (N)}: circuit-tracer's prune_graph. Nodes are kept while their influence on the logits makes up
-- node_threshold of the total (tokens and logits always), then edges while their influence makes up edge_threshold;
-- features and errors left without an outgoing edge, and features without an incoming one, go, until none changes.
-- cumulative_scores: each node's place in the cumulative influence (the share of the nodes at least as influential).
function M.prune_graph(g, opts)
  local where = 'sae.prune_graph'
  check_graph(g, where, 2)
  opts = options.check(opts, {'node_threshold', 'edge_threshold'}, where, 2)
  local node_threshold = M.threshold(opts.node_threshold, 'node_threshold', 0.8, where, 2)
  local edge_threshold = M.threshold(opts.edge_threshold, 'edge_threshold', 0.98, where, 2)
  local A = g.adjacency_matrix:float():cpu()
  local N = A:size(1)
  local K, T, n = g.logit_probabilities:size(1), g.input_tokens:size(1), g.selected_features:size(1)
  local w = logit_weights(g)
  local node_influence = influence(normalize(A), w, where)
  local node_mask = node_influence:ge(find_threshold(node_influence, node_threshold))
  node_mask:narrow(1, N - K - T + 1, K + T):fill_(true)
  local drop = node_mask:logical_not()
  local pruned = A:masked_fill(drop:view(-1, 1), 0):masked_fill(drop:view(1, -1), 0)
  local normalized = normalize(pruned)
  local edge_scores = normalized * (influence(normalized, w, where) + w):view(-1, 1)
  local edge_mask = edge_scores:ge(find_threshold(edge_scores:view(-1), edge_threshold))
  local sources = N - K - T  -- features and errors: they must write somewhere kept
  local function trim()
    local keep_src = edge_mask:narrow(2, 1, sources):any(1)
    node_mask:narrow(1, 1, sources):copy_(node_mask:narrow(1, 1, sources):logical_and(keep_src))
    local keep_feat = edge_mask:narrow(1, 1, n):any(2)
    node_mask:narrow(1, 1, n):copy_(node_mask:narrow(1, 1, n):logical_and(keep_feat))
  end
  local old = node_mask:clone()
  trim()
  while not node_mask:eq(old):all():item() do
    old:copy_(node_mask)
    local off = node_mask:logical_not()
    edge_mask = edge_mask:masked_fill(off:view(-1, 1), false):masked_fill(off:view(1, -1), false)
    trim()
  end
  local sorted, order = node_influence:sort(1, true)
  local cum = sorted:cumsum(1) / sorted:sum()
  local scores = torch.zeros({N}, {device = 'cpu'}):scatter(1, order, cum)
  return {node_mask = node_mask, edge_mask = edge_mask, cumulative_scores = scores}
end

-- sae.graph_scores(graph) -> replacement_score, completeness_score: circuit-tracer's compute_graph_scores. The
-- replacement score is the share of the tokens' and errors' influence on the logits that is the tokens'; the
-- completeness score the share of each node's inputs that are not errors, weighted by the node's influence.
function M.graph_scores(g)
  local where = 'sae.graph_scores'
  check_graph(g, where, 2)
  local A = g.adjacency_matrix:float():cpu()
  local T, n, L = g.input_tokens:size(1), g.selected_features:size(1), g.n_layers
  local w = logit_weights(g)
  local normalized = normalize(A)
  local node_influence = influence(normalized, w, where)
  local errors = node_influence:narrow(1, n + 1, L * T):sum():item()
  local tokens = node_influence:narrow(1, n + L * T + 1, T):sum():item()
  local non_error = 1 - normalized:narrow(2, n + 1, L * T):sum(2)
  local out = node_influence + w
  return tokens / (tokens + errors), ((non_error * out):sum() / out:sum()):item()
end

return M
