-- Runs one model of test_model_parity.py on the weights and batch it wrote:
--   anatomy model_parity.lua CASE INPUT.safetensors OUTPUT.safetensors
-- and writes the logits, the loss and every parameter's gradient.
local case, input, output = arg[1], arg[2], arg[3]

local V, C, T = 17, 16, 8
local builders = {
  vibenet_plain = function() return models.vibenet{vocab = V, dim = C, layers = 3, seq = T, block = 'plain'} end,
  vibenet_ffn = function() return models.vibenet{vocab = V, dim = C, layers = 3, seq = T, block = 'ffn'} end,
  vibenet_gate = function() return models.vibenet{vocab = V, dim = C, layers = 3, seq = T, block = 'gate'} end,
  gpt = function() return models.gpt{vocab = V, dim = C, heads = 2, layers = 2, seq = T, ffn = 32} end,
  gpt_no_residual = function() return models.gpt{vocab = V, dim = C, heads = 2, layers = 2, seq = T, ffn = 32, residual = false} end,
  gpt_pre = function() return models.gpt{vocab = V, dim = C, heads = 2, layers = 2, seq = T, ffn = 32, norm = 'pre', activation = 'gelu'} end,
}

local model = assert(builders[case], 'unknown case ' .. tostring(case))()
local w = torch.load_safetensors(input)
local state = {}
for name, t in pairs(w) do
  if not name:find('^input%.') then state[name] = t end
end
model:load_state_dict(state)                   -- strict: every name must match
local logits = model(w['input.ids'])
local loss = nn.functional.cross_entropy(logits, w['input.targets'])
loss:backward()
local out = {logits = logits, loss = loss}
for name, p in model:named_parameters() do out['grad.' .. name] = p.grad end
torch.save_safetensors(output, out)
