-- The anatomy side of bench/hooks.py, on a GPT-2-small-shaped folder:
--   anatomy bench/hooks.lua FOLDER OUT.json [B T ROUNDS]
-- 1. idle hook points: forward passes of the model as it is (each block
--    calls self:hook three times, every built-in block checks for a hook)
--    alternating with the same model whose blocks skip those calls;
-- 2. idle probes: a do-nothing probe on every module, alternating likewise;
-- 3. the full cache: probe.run_with_cache with every hook point and module
--    output (every block on its explicit path; an attention's per-head
--    result only on request, so not here), its time and memory.
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')
local native = require('anatomy.torch.native')
local folder, out = arg[1], arg[2]
local B, T, rounds = tonumber(arg[3] or 8), tonumber(arg[4] or 256), tonumber(arg[5] or 5)
local model = models.from_pretrained(folder)
torch.manual_seed(0)
local x = torch.randint(1, model.config.vocab + 1, {B, T})
local function forward() return torch.no_grad(function() return model(x) end) end

-- the blocks' forward without hook calls (what the model computed before hook points existed)
local function without_hooks(on)
  for _, l in ipairs(model:layers()) do
    local b = l[2]
    if on then
      rawset(b, 'forward', function(self, h)
        h = h + self.attn(self.ln_1(h))
        return h + self.mlp(self.ln_2(h))
      end)
    else
      rawset(b, 'forward', nil)
    end
  end
end

-- median seconds of fn over `rounds` rounds, alternating with other (also timed)
local function alternate(setup_a, setup_b)
  local a, b = {}, {}
  setup_a(); forward(); setup_b(); forward()  -- warm-up
  for i = 1, rounds do
    setup_a()
    local s = native.now(); forward(); a[i] = native.now() - s
    setup_b()
    s = native.now(); forward(); b[i] = native.now() - s
  end
  table.sort(a); table.sort(b)
  return a[math.ceil(rounds / 2)], b[math.ceil(rounds / 2)], a, b
end

local result = {B = B, T = T, rounds = rounds, threads = torch.get_num_threads(), libtorch = torch.__version__,
  parameters = model:num_parameters()}
result.hooks_seconds, result.no_hooks_seconds = alternate(function() without_hooks(false) end, function() without_hooks(true) end)
without_hooks(false)

local handles, names_all = {}, {}
for name in model:named_modules() do if name ~= '' then names_all[#names_all + 1] = name end end
result.idle_probes_seconds, result.no_probes_seconds = alternate(function()
  for _, name in ipairs(names_all) do handles[#handles + 1] = probe.idle(model, name) end
end, function()
  for _, h in ipairs(handles) do h:remove() end
  handles = {}
end)
result.idle_probes = #names_all

-- the full cache, then the plain forward for its ratio
local cache_times = {}
local memory, names
for i = 1, math.max(3, math.floor(rounds / 2)) do
  collectgarbage()
  local s = native.now()
  local _, cache = probe.run_with_cache(model, x)
  cache_times[i] = native.now() - s
  memory, names = cache:memory(), #cache:names()
  cache = nil
end
table.sort(cache_times)
result.cache_seconds = cache_times[math.ceil(#cache_times / 2)]
result.cache_bytes, result.cache_names = memory, names
fs.write_atomic(out, json.encode(result))
