-- The anatomy side of test_tl_names_parity.py: a Hugging Face GPT-2 folder
-- through models.from_pretrained, run_with_cache on the ids it is given, and
-- every TransformerLens hook name it lists looked up in the cache by that
-- name (the alias): the tensors found, and the names anatomy has no
-- counterpart for. arg: folder, ids.safetensors, names.txt, out.safetensors
local fs = require('anatomy.io.fs')
local model = models.from_pretrained(arg[1])
local ids = torch.load_safetensors(arg[2]).ids
local _, cache = probe.run_with_cache(model, ids, {filter = {'*', '*.result'}})
local out, missing = {}, {}
for name in fs.read(arg[3]):gmatch('[^\n]+') do
  local ok, t = pcall(function() return cache[name] end)
  if ok and t ~= nil then out[name] = t:contiguous() else missing[#missing + 1] = name end
end
torch.save_safetensors(arg[4], out, {missing = table.concat(missing, ' ')})
