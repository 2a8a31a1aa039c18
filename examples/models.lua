-- The architectures anatomy ships, as trees with parameter counts, and a
-- block written in Lua next to its built-in twin.
--   anatomy examples/models.lua
torch.manual_seed(0)
local V, T = 65, 64   -- a character vocabulary and context

local zoo = {
  {'VibeNet, plain blocks', models.vibenet{vocab = V, dim = 64, layers = 4, seq = T}},
  {'VibeNet, ffn blocks', models.vibenet{vocab = V, dim = 64, layers = 4, seq = T, block = 'ffn'}},
  {'VibeNet, gated residual', models.vibenet{vocab = V, dim = 64, layers = 4, seq = T, block = 'gate'}},
  {'VibeNet, Sinkhorn hyper-connections', models.vibenet{vocab = V, dim = 64, layers = 4, seq = T, block = 'hyper', streams = 4}},
  {'GPT, the one-layer model of the residual-ablation post', models.gpt{vocab = V, dim = 64, heads = 2, layers = 1, seq = T, ffn = 128}},
  {'GPT, same without residuals', models.gpt{vocab = V, dim = 64, heads = 2, layers = 1, seq = T, ffn = 128, residual = false}},
  {'Funnel, 512 -> 256 -> 128 -> 64', models.funnel{vocab = V, seq = T}},
  {'Stateful GPT', models.stateful{vocab = V, dim = 64, heads = 8, layers = 2, seq = 32, ffn = 256}},
}

local ids = torch.randint(1, V + 1, {2, 32})
for _, entry in ipairs(zoo) do
  local name, model = entry[1], entry[2]
  print(('\n== %s: %s parameters'):format(name, nn.format_count(model:num_parameters())))
  print(model)
  local logits = model(ids)
  print(('forward: ids %s -> logits %s'):format(table.concat(ids:size(), 'x'), table.concat(logits:size(), 'x')))
end

-- A block written in Lua from tensor ops is as good as a built-in one.
local Gate = nn.block('Gate', function(self, inner, dim)
  self.gate = nn.Linear(dim, dim)
  self.inner = inner
end)
function Gate:forward(x) return self.gate(x) + self.inner(x) end

local mine = Gate(nn.Sequential{nn.RMSNorm(64), nn.VibeAttention()}, 64)
local builtin = nn.Gate(nn.Sequential{nn.RMSNorm(64), nn.VibeAttention()}, 64)
mine:load_state_dict(builtin:state_dict())
local x = torch.randn(2, 16, 64)
print(('\n== a Lua-defined Gate against nn.Gate on the same weights: max difference %.3g')
  :format((mine(x) - builtin(x)):abs():max():item()))
