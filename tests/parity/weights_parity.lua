-- The anatomy side of test_weights_parity.py: a Hugging Face folder through
-- models.from_pretrained; every head's OV and QK singular values and
-- Frobenius norms, and the Q, K and V composition scores, written for the
-- comparison with TransformerLens. arg: folder, out.safetensors
local model = models.from_pretrained(arg[1])
local layers = #model:layers()
local heads = weights.attention(model, 1).heads
local out = {}
for _, kind in ipairs({'ov', 'qk'}) do
  local sv, norms = {}, {}
  for l = 1, layers do
    for h = 1, heads do
      local f = weights[kind](model, l, h)
      sv[#sv + 1] = f:singular_values():unsqueeze(1)
      norms[#norms + 1] = f:norm()
    end
  end
  out[kind .. '_singular_values'] = torch.cat(sv, 1):reshape(layers, heads, -1):contiguous()
  out[kind .. '_norms'] = torch.tensor(norms, {dtype = 'float64'}):reshape(layers, heads)
end
for _, mode in ipairs({'q', 'k', 'v'}) do
  out['composition_' .. mode] = weights.composition(model, mode).scores
end
torch.save_safetensors(arg[2], out)
