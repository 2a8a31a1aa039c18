-- The anatomy side of test_causal_parity.py: loads the weights it wrote into
-- a pre-norm models.gpt of three layers and runs patching.path,
-- patching.attribute and patching.edges in each of the settings listed,
-- writing the results:
--   anatomy causal_parity.lua INPUT.safetensors OUTPUT.safetensors
local input, output = arg[1], arg[2]
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local model, w = require('parity_gpt').load(input, 3)
local metric = patching.logit_diff(4, 6)  -- tokens 3 and 5 in PyTorch's 0-based ids
local clean, corrupt = w['input.clean'], w['input.corrupt']
local out = {}
-- path patching
local paths = {
  {sender = {1, 2}, receivers = {{2, 1}, {3, 3}}, via = 'q'},
  {sender = {1, 2}, receivers = {{2, 1}, {3, 3}}, via = 'k'},
  {sender = {1, 2}, receivers = {{2, 1}, {3, 3}}, via = 'v'},
  {sender = {{1, 1}, {2, 4}}, receivers = {{3, 2}}, via = 'k'},
  {sender = {1, 3}, receivers = {2, 3}, via = 'resid'},
}
local values, last = {}, nil
for i, s in ipairs(paths) do
  last = patching.path(model, clean, corrupt, metric, s)
  values[i] = last.value
end
values[#values + 1] = last.clean
values[#values + 1] = last.corrupt
out.path = torch.tensor(values, {dtype = 'float64'})
-- attribution patching
local settings = {
  {'atp_resid_pre_position', {over = 'resid_pre', per = 'position'}},
  {'atp_z_head', {over = 'attn.z', per = 'head'}},
  {'atp_mlp_post_neuron', {over = 'mlp.post', per = 'neuron'}},
  {'atpstar_k_head', {over = 'attn.k', per = 'head', method = 'atp-qk'}},
  {'atpstar_q_position', {over = 'attn.q', per = 'position', method = 'atp-qk'}},
  {'ig_resid_pre_layer', {over = 'resid_pre', per = 'layer', method = 'ig', steps = 4}},
}
for _, s in ipairs(settings) do
  out[s[1]] = patching.attribute(model, clean, corrupt, metric, s[2]).grid:double()
end
-- edge attribution: every edge test_causal_parity.py lists (edges.txt beside the output), in its order
local keys = {}
for line in io.lines(output:match('^(.*)/') .. '/edges.txt') do
  local from, to, via = line:match('^(.-)\t(.-)\t(.*)$')
  keys[#keys + 1] = {from, to, via ~= '' and via or nil}
end
for name, opts in pairs{eap = {}, eap_ig = {method = 'eap-ig', steps = 4}} do
  local g = patching.edges(model, clean, corrupt, metric, opts)
  if #g.edges ~= #keys then error(('%s: %d edges, the reference has %d'):format(name, #g.edges, #keys)) end
  local scores = {}
  for i, k in ipairs(keys) do scores[i] = g:score(k[1], k[2], k[3]) end
  out[name] = torch.tensor(scores, {dtype = 'float64'})
end
torch.save_safetensors(output, out)
