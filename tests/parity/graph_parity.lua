-- The anatomy side of test_graph_parity.py: loads the tiny model folders
-- written by transformers and the transcoders written by circuit-tracer,
-- builds the attribution graph of the prompt with sae.attribute, prunes it
-- (sae.prune_graph) and scores it (sae.graph_scores), and writes their
-- tensors (node indices as anatomy's, from 1).
--   anatomy graph_parity.lua OUT IDS MAX_N_LOGITS DESIRED_LOGIT_PROB BATCH_SIZE MAX_FEATURE_NODES NAME|MODEL_DIR|CLT_DIR|INPUT_HOOK|OUTPUT_HOOK...
local out = arg[1]
local ids = {}
for id in arg[2]:gmatch('%d+') do ids[#ids + 1] = tonumber(id) end
local opts = {max_n_logits = tonumber(arg[3]), desired_logit_prob = tonumber(arg[4]), batch_size = tonumber(arg[5])}
local results = {}
for i = 7, #arg do
  local name, model_dir, folder, input_hook, output_hook = arg[i]:match('^([^|]+)|([^|]+)|([^|]+)|([^|]+)|([^|]+)$')
  local model = models.from_pretrained(model_dir)
  model:eval()
  local c = sae.load_clt(folder, {input_hook = input_hook, output_hook = output_hook})
  local g = sae.attribute(model, c, ids, opts)
  -- and with circuit-tracer's max_feature_nodes: the features visited by their influence on the logits
  local capped_opts = {max_feature_nodes = tonumber(arg[6]), update_interval = 2}
  for k, v in pairs(opts) do capped_opts[k] = v end
  local capped = sae.attribute(model, c, ids, capped_opts)
  for _, k in ipairs{'adjacency_matrix', 'active_features', 'activation_values', 'selected_features', 'logit_tokens',
    'logit_probabilities'} do
    results[name .. '.' .. k] = g[k]
    results[name .. '.capped.' .. k] = capped[k]
  end
  local pruned = sae.prune_graph(g, {node_threshold = 0.8, edge_threshold = 0.98})
  results[name .. '.node_mask'] = pruned.node_mask:long()
  results[name .. '.edge_mask'] = pruned.edge_mask:long()
  results[name .. '.cumulative_scores'] = pruned.cumulative_scores
  local replacement, completeness = sae.graph_scores(g)
  results[name .. '.scores'] = torch.tensor({replacement, completeness})
  print(('%s: %s, %d features, %d logits, %d nodes'):format(name, tostring(c), g.active_features:size(1),
    g.logit_tokens:size(1), g.adjacency_matrix:size(1)))
end
torch.save_safetensors(out, results)
