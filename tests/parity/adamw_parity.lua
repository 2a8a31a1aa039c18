-- Three AdamW steps of models.gpt on the weights and batch test_adamw_parity.py
-- wrote; writes the three losses and the final parameters.
--   anatomy adamw_parity.lua INPUT.safetensors OUTPUT.safetensors
local input, output = arg[1], arg[2]
local model = models.gpt{vocab = 17, dim = 16, heads = 2, layers = 2, seq = 8, ffn = 32}
local w = torch.load_safetensors(input)
local state = {}
for name, t in pairs(w) do if not name:find('^input%.') then state[name] = t end end
model:load_state_dict(state)
local opt = optim.AdamW(model, {lr = 1e-2, betas = {0.9, 0.95}, weight_decay = 0.1})
local out = {}
for step = 1, 3 do
  opt:zero_grad()
  local loss = nn.functional.cross_entropy(model(w['input.ids']), w['input.targets'])
  loss:backward()
  opt:step()
  out['loss.' .. step] = loss:detach()
end
for name, p in model:named_parameters() do out['param.' .. name] = p end
torch.save_safetensors(output, out)
