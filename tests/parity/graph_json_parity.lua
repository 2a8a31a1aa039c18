-- The anatomy side of test_graph_json_parity.py: loads each tiny model
-- folder (weights and tokenizer written by transformers) and transcoders
-- written by circuit-tracer, builds the attribution graph of the prompt with
-- sae.attribute and writes it with g:json into OUT_DIR (its <slug>.json and
-- graph-metadata.json). SCAN is a name, or names joined by ',' (a list).
--   anatomy graph_json_parity.lua OUT_DIR IDS MAX_N_LOGITS DESIRED_LOGIT_PROB BATCH_SIZE
--     SLUG|MODEL_DIR|CLT_DIR|INPUT_HOOK|OUTPUT_HOOK|MAX_FEATURE_NODES|NODE_THRESHOLD|EDGE_THRESHOLD|SCAN...
local out = arg[1]
local ids = {}
for id in arg[2]:gmatch('%d+') do ids[#ids + 1] = tonumber(id) end
for i = 6, #arg do
  local f = {}
  for part in arg[i]:gmatch('[^|]+') do f[#f + 1] = part end
  local slug, model_dir, folder, input_hook, output_hook = f[1], f[2], f[3], f[4], f[5]
  local model = models.from_pretrained(model_dir)  -- its tokenizer too: g:json's default
  model:eval()
  local c = sae.load_clt(folder, {input_hook = input_hook, output_hook = output_hook})
  local opts = {max_n_logits = tonumber(arg[3]), desired_logit_prob = tonumber(arg[4]), batch_size = tonumber(arg[5])}
  if tonumber(f[6]) > 0 then opts.max_feature_nodes, opts.update_interval = tonumber(f[6]), 2 end
  local g = sae.attribute(model, c, ids, opts)
  local scan = f[9]
  if scan:find(',') then
    local list = {}
    for s in scan:gmatch('[^,]+') do list[#list + 1] = s end
    scan = list
  end
  local file = g:json(out, {slug = slug, scan = scan, node_threshold = tonumber(f[7]), edge_threshold = tonumber(f[8])})
  print(('%s: %d nodes, %s'):format(slug, g.adjacency_matrix:size(1), file))
end
