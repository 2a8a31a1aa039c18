-- The anatomy side of bench/peers.py, on a GPT-2-small-shaped folder:
--   anatomy bench/peers.lua FOLDER OUT.json B T REPEATS
-- forward passes (eval, no grad), probe.run_with_cache with every hook point
-- (an attention's per-head result left out, as TransformerLens leaves out
-- hook_result) and with the residual stream only, alternating; then one
-- autopsy.run on the same ids (logit lens, removal of every block, and the
-- rest). Writes the times (each repeat's), the cache's memory and the
-- autopsy's loss to OUT.json.
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')
local native = require('anatomy.torch.native')
local folder, out = arg[1], arg[2]
local B, T, repeats = tonumber(arg[3] or 8), tonumber(arg[4] or 256), tonumber(arg[5] or 3)
local model = models.from_pretrained(folder)
-- the ids both sides read: drawn by bench/peers.py, 0-based, one per line
local ids, targets = {}, {}
for line in io.lines(folder .. '/ids.txt') do
  local row = {}
  for v in line:gmatch('%d+') do row[#row + 1] = tonumber(v) + 1 end
  if #ids < B then ids[#ids + 1] = row else targets[#targets + 1] = row end
end
local x = torch.tensor(ids, {dtype = 'int64'})
local y = torch.tensor(targets, {dtype = 'int64'})
assert(x:size(1) == B and x:size(2) == T and y:size(1) == B, 'ids.txt does not hold B x T ids and targets')

local function timed(fn)
  collectgarbage()
  local s = native.now()
  local r = fn()
  return native.now() - s, r
end
local function forward() return torch.no_grad(function() return model(x) end) end
local result = {B = B, T = T, threads = torch.get_num_threads(), libtorch = torch.__version__,
  cpu_capability = torch.backends.cpu.get_cpu_capability(), config = torch.__config__.show(),
  forward = {}, cache = {}, cache_resid = {}}
forward(); probe.run_with_cache(model, x)  -- warm-up
for i = 1, repeats do
  result.forward[i] = timed(forward)
  local t, cache
  t, cache = timed(function() local _, c = probe.run_with_cache(model, x); return c end)
  result.cache[i] = t
  result.cache_entries, result.cache_bytes = #cache:names(), cache:memory()
  cache = nil
  result.cache_resid[i] = timed(function() return probe.run_with_cache(model, x, {filter = 'h.*.resid_post'}) end)
end
local a
result.autopsy_seconds, a = timed(function() return autopsy.run(model, {x, y}, {seq = T}) end)
result.autopsy_loss = a.loss
result.lens_loss, result.removal_loss = {}, {}
for _, r in ipairs(a.rows) do
  if r.kind == 'block' then
    result.lens_loss[#result.lens_loss + 1] = r.lens_loss
    result.removal_loss[#result.removal_loss + 1] = r.removal_loss
  end
end
fs.write_atomic(out, json.encode(result))
