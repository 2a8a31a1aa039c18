-- sae.attribute in chunks: the graph is the same whatever the chunks its
-- memory is bounded by (graph.chunk: positions a chunk for the features
-- and errors, features a chunk for a row's feature entries, rows a chunk
-- for the kept adjacency; graph_attention.chunk: query positions a chunk
-- for the frozen attention's P^T g). With chunks of one item each on a
-- tiny GPT-2 and Llama (grouped-query attention), the adjacency, features
-- and activations equal those of one chunk. The frozen attention itself is
-- checked against the model by hand in test_graph.lua.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, close = H.test, H.eq, H.close
local graph = require('anatomy.features.graph')
local attention = require('anatomy.features.graph_attention')

local ids = {1, 5, 9, 2, 17, 9, 3, 11}

local function family(kind) return H.tiny_lm(kind, kind == 'gpt2' and 3 or 4) end

local function with_chunks(g_chunk, a_chunk, fn)
  local g0, a0 = graph.chunk, attention.chunk
  graph.chunk, attention.chunk = g_chunk, a_chunk
  local ok, r = pcall(fn)
  graph.chunk, attention.chunk = g0, a0
  if not ok then error(r, 0) end
  return r
end

for _, kind in ipairs{'gpt2', 'llama'} do
  for _, capped in ipairs{false, true} do
    test(('%s%s: chunks of one position, feature, row and query give the graph of one chunk'):format(kind,
      capped and ', max_feature_nodes 12' or ''), function()
      local model = family(kind)
      local c = H.randomize_transcoders(sae.clt{n_layers = 3, d_model = 16, d_transcoder = 10, kind = 'jumprelu',
        input_hook = 'mlp.hook_in', output_hook = 'mlp.hook_out'}, 5)
      local opts = {max_n_logits = 4, desired_logit_prob = 0.99, batch_size = 3, max_feature_nodes = capped and 12 or nil,
        update_interval = 1}
      local whole = sae.attribute(model, c, ids, opts)
      local n = whole.active_features:size(1)
      assert(n > 20, 'expected more than 20 active features, got ' .. n)
      -- 1 float a chunk: every chunk holds one item
      local parts = with_chunks(1, 1, function() return sae.attribute(model, c, ids, opts) end)
      close(parts.active_features, whole.active_features, 0, 'active features')
      close(parts.selected_features, whole.selected_features, 0, 'selected features')
      close(parts.activation_values, whole.activation_values, 1e-6, 'activations')
      eq(parts.adjacency_rows:size(), whole.adjacency_rows:size(), 'kept rows')
      close(parts.adjacency_matrix, whole.adjacency_matrix, 1e-5, 'adjacency')
      local A = whole.adjacency_matrix
      local f, K = whole.selected_features:size(1), whole.logit_tokens:size(1)
      eq(A:size(1), f + 4 * #ids + K, 'N: the features visited, 3·T errors, T tokens, K logits')
      close(A:narrow(1, 1, f), whole.adjacency_rows:narrow(1, 1, f), 0, 'the feature rows are the kept rows')
      eq(A:narrow(1, f + 1, A:size(1) - f - K):abs():sum():item(), 0, 'error and token rows are zero')
      assert(A:narrow(1, A:size(1) - K + 1, K):abs():sum():item() > 0, 'the logit rows are not all zero')
    end)
  end
end

H.done()
