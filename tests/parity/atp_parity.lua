-- The anatomy side of test_atp_parity.py: the GPT it wrote (three layers),
-- patching.attribute in each setting listed, the grids written:
--   anatomy atp_parity.lua INPUT.safetensors OUTPUT.safetensors
local input, output = arg[1], arg[2]
local w = torch.load_safetensors(input)
local model = models.gpt{vocab = 17, dim = 16, heads = 4, layers = 3, seq = 8, ffn = 32, norm = 'pre', activation = 'gelu'}
local state = {}
for name, t in pairs(w) do
  if not name:find('^input%.') then state[name] = t end
end
model:load_state_dict(state)
model:eval()
local metric = patching.logit_diff(4, 6)  -- tokens 3 and 5 in PyTorch's 0-based ids
local settings = {
  {'atp_resid_pre_position', {over = 'resid_pre', per = 'position'}},
  {'atp_z_head', {over = 'attn.z', per = 'head'}},
  {'atp_mlp_post_neuron', {over = 'mlp.post', per = 'neuron'}},
  {'atpstar_k_head', {over = 'attn.k', per = 'head', method = 'atp*'}},
  {'atpstar_q_position', {over = 'attn.q', per = 'position', method = 'atp*'}},
  {'ig_resid_pre_layer', {over = 'resid_pre', per = 'layer', method = 'ig', steps = 4}},
}
local out = {}
for _, s in ipairs(settings) do
  local r = patching.attribute(model, w['input.clean'], w['input.corrupt'], metric, s[2])
  out[s[1]] = r.grid:double()
end
torch.save_safetensors(output, out)
