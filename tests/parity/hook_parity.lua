-- The anatomy side of test_hook_parity.py: loads the weights it wrote into
-- a pre-norm models.gpt, runs probe.run_with_cache on its ids (every module
-- output and hook point), then the two interventions, and writes it all:
--   anatomy hook_parity.lua INPUT.safetensors OUTPUT.safetensors
local input, output = arg[1], arg[2]
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local model, w = require('parity_gpt').load(input, 2)
local ids, other = w['input.ids'], w['input.other']
local logits, cache = probe.run_with_cache(model, ids, {filter = {'*', '*.result'}})  -- each head's result too
local out = {logits = logits}
for _, name in ipairs(cache:names()) do out['cache ' .. name] = cache[name] end
local h = probe.ablate(model, 'blocks.1.attn.z', {head = 2})
out.ablated = torch.no_grad(function() return model(ids) end)
h:remove()
local _, other_cache = probe.run_with_cache(model, other, {filter = 'blocks.2.resid_pre'})
h = probe.patch(model, 'blocks.2.resid_pre', other_cache, {position = 3})
out.patched = torch.no_grad(function() return model(ids) end)
h:remove()
torch.save_safetensors(output, out)
