-- The autopsy of models.gpt (pre-norm) on the weights and batch that
-- test_metrics_parity.py wrote; writes the autopsy as JSON.
--   anatomy metrics_parity.lua INPUT.safetensors OUTPUT.json
local input, output = arg[1], arg[2]
local model = models.gpt{vocab = 17, dim = 16, heads = 2, layers = 2, seq = 8, ffn = 32, norm = 'pre', activation = 'gelu'}
local w = torch.load_safetensors(input)
local state = {}
for name, t in pairs(w) do if not name:find('^input%.') then state[name] = t end end
model:load_state_dict(state)
local a = autopsy.run(model, {w['input.ids'], w['input.targets']}, {k = 1})
a:json(output)
