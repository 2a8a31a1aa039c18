-- Cached generation across Phi-3's long-RoPE boundary, for test_phi3_parity.py.
-- arg: folder, out.json, the prompt's ids (0-based, comma-separated), the
-- number of new tokens, and a length n. Writes the greedy continuation with
-- the key/value cache and each step's logits at its last position (from the
-- final norm's output, by the head), the same continuation without the cache,
-- and a bare forward under the cache: the first n tokens of the continuation,
-- then token n + 1 alone (its logits).
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')
local model = models.from_pretrained(arg[1])
local prompt = {}
for v in arg[3]:gmatch('%d+') do prompt[#prompt + 1] = tonumber(v) + 1 end
local ids = torch.tensor(prompt, {dtype = 'int64'}):unsqueeze(1)
local max_new, n = tonumber(arg[4]), tonumber(arg[5])
local gen, steps = model:generate(ids, {max_new = max_new, temperature = 0, kv_cache = true, return_cache = {model.final_norm}})
local out = {generated = (gen - 1)[1]:tolist(), step_logits = {}, step_positions = {}}
for i, c in ipairs(steps) do
  local h = c[model.final_norm]
  out.step_positions[i] = h:size(2)
  out.step_logits[i] = nn.functional.linear(h:select(2, h:size(2)), model:unembedding())[1]:tolist()
end
out.uncached = (model:generate(ids, {max_new = max_new, temperature = 0, kv_cache = false}) - 1)[1]:tolist()
torch.no_grad(function()
  model:kv_cache(true)
  model(gen:narrow(2, 1, n))
  out.bare = model(gen:narrow(2, n + 1, 1))[1][1]:tolist()
  model:kv_cache(false)
end)
fs.write_atomic(arg[2], json.encode(out))
