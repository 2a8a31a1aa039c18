-- The anatomy side of test_path_parity.py: loads the weights it wrote into a
-- pre-norm models.gpt of three layers and runs patching.path in each of the
-- settings listed, writing the path-patched metric and the clean and corrupt
-- ones: anatomy path_parity.lua INPUT.safetensors OUTPUT.safetensors
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
  {sender = {1, 2}, receivers = {{2, 1}, {3, 3}}, via = 'q'},
  {sender = {1, 2}, receivers = {{2, 1}, {3, 3}}, via = 'k'},
  {sender = {1, 2}, receivers = {{2, 1}, {3, 3}}, via = 'v'},
  {sender = {{1, 1}, {2, 4}}, receivers = {{3, 2}}, via = 'k'},
  {sender = {1, 3}, receivers = {2, 3}, via = 'resid'},
}
local values = {}
local last
for i, s in ipairs(settings) do
  last = patching.path(model, w['input.clean'], w['input.corrupt'], metric, s)
  values[i] = last.value
end
values[#values + 1] = last.clean
values[#values + 1] = last.corrupt
torch.save_safetensors(output, {values = torch.tensor(values, {dtype = 'float64'})})
