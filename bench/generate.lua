-- The anatomy side of the generation benchmark (bench/generate.py): greedy
-- generation from a Hugging Face folder, with and without the key/value cache.
--   anatomy bench/generate.lua FOLDER PROMPT_IDS.json OUT.json NEW REPEATS
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')
local native = require('anatomy.torch.native')
local folder, prompt_path, out = arg[1], arg[2], arg[3]
local new, repeats = tonumber(arg[4]), tonumber(arg[5])
local model = models.from_pretrained(folder)
local prompt = torch.tensor(json.decode(fs.read(prompt_path)), {dtype = 'int64'}):add(1):unsqueeze(1)  -- PyTorch's 0-based ids
local result = {threads = torch.get_num_threads()}
for _, cached in ipairs{true, false} do
  local key = cached and 'cached' or 'uncached'
  model:generate(prompt, {max_new = 4, temperature = 0, kv_cache = cached})  -- warm-up
  result[key .. '_seconds'] = {}
  for i = 1, repeats do
    local s = native.now()
    local ids = model:generate(prompt, {max_new = new, temperature = 0, kv_cache = cached})
    result[key .. '_seconds'][i] = native.now() - s
    result[key .. '_ids'] = ids:squeeze(1):tolist()
  end
end
for i, v in ipairs(result.cached_ids) do result.cached_ids[i] = v - 1 end
for i, v in ipairs(result.uncached_ids) do result.uncached_ids[i] = v - 1 end
fs.write_atomic(out, json.encode(result))
