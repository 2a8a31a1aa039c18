-- The GPT of the hook parity test in anatomy: the weights test_hook_parity.py
-- (or a test built on its GPT) wrote, loaded into a pre-norm models.gpt.
-- require('parity_gpt').load(path, layers) -> model (eval mode), the file's tensors
local M = {}

function M.load(path, layers)
  local w = torch.load_safetensors(path)
  local model = models.gpt{vocab = 17, dim = 16, heads = 4, layers = layers, seq = 8, ffn = 32, norm = 'pre', activation = 'gelu'}
  local state = {}
  for name, t in pairs(w) do
    if not name:find('^input%.') then state[name] = t end
  end
  model:load_state_dict(state)
  model:eval()
  return model, w
end

return M
