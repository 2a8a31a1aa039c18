-- The anatomy side of test_graph_parity.py: loads the tiny model folder
-- written by transformers and the transcoders written by circuit-tracer,
-- builds the attribution graph of the prompt with sae.attribute, and writes
-- its tensors (node indices as anatomy's, from 1).
--   anatomy graph_parity.lua MODEL_DIR OUT IDS MAX_N_LOGITS DESIRED_LOGIT_PROB BATCH_SIZE NAME=CLT_DIR...
local model_dir, out = arg[1], arg[2]
local ids = {}
for id in arg[3]:gmatch('%d+') do ids[#ids + 1] = tonumber(id) end
local opts = {max_n_logits = tonumber(arg[4]), desired_logit_prob = tonumber(arg[5]), batch_size = tonumber(arg[6])}
local model = models.from_pretrained(model_dir)
model:eval()
local results = {}
for i = 7, #arg do
  local name, folder = arg[i]:match('^([^=]+)=(.*)$')
  local c = sae.load_clt(folder, {input_hook = 'mlp.hook_in', output_hook = 'mlp.hook_out'})
  local g = sae.attribute(model, c, ids, opts)
  for _, k in ipairs{'adjacency_matrix', 'active_features', 'activation_values', 'selected_features', 'logit_tokens',
    'logit_probabilities'} do
    results[name .. '.' .. k] = g[k]
  end
  print(('%s: %s, %d features, %d logits, %d nodes'):format(name, tostring(c), g.active_features:size(1),
    g.logit_tokens:size(1), g.adjacency_matrix:size(1)))
end
torch.save_safetensors(out, results)
