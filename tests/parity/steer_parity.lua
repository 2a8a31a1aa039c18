-- Writes, for test_steer_parity.py, what steer.vector reads and what it
-- makes: each example's cached activation at every layer's resid_post
-- (pos.<i>.<layer>, neg.<i>.<layer>: (T, C), examples of different lengths)
-- and the vectors for method mean and pca, reduce mean and last
-- (<method>.<reduce>.<layer>). arg[1]: the output file.
torch.manual_seed(7)
local m = models.gpt{vocab = 23, dim = 16, heads = 4, layers = 3, seq = 16, ffn = 32}
local function example(T) return torch.randint(1, 24, {T}):long() end
local pos, neg = {}, {}
for i = 1, 5 do pos[i] = example(3 + i); neg[i] = example(9 - i) end
local out = {}
local layers = m:layers()
for _, side in ipairs{{'pos', pos}, {'neg', neg}} do
  for i, ids in ipairs(side[2]) do
    local _, cache = probe.run_with_cache(m, ids:unsqueeze(1))
    for _, l in ipairs(layers) do out[('%s.%d.%s'):format(side[1], i, l[1])] = cache[l[1] .. '.resid_post'][1] end
  end
end
for _, method in ipairs{'mean', 'pca'} do
  for _, reduce in ipairs{'mean', 'last'} do
    local v = steer.vector(m, pos, neg, {method = method, reduce = reduce})
    for _, l in ipairs(v.layers) do out[('%s.%s.%s'):format(method, reduce, l)] = v.vectors[l] end
  end
end
torch.save_safetensors(arg[1], out)
