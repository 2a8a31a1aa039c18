-- Generation: the key/value cache gives what recomputing the whole context
-- gives (each family and the built-in GPT), probes and interventions act at
-- every step, each step's activations come back, options are checked.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, close, raises = H.test, H.eq, H.close, H.raises

local V = 40
-- The five pretrained families (random weights, built from their config.json settings) and the built-in GPT.
local function models_under_test() return H.family_models(V, 5) end

test('cached generation: greedy tokens identical to the uncached path, logits within 1e-5 of their scale, for every family', function()
  torch.manual_seed(1)
  for _, entry in ipairs(models_under_test()) do
    local name, m = entry[1], entry[2]
    m:eval()
    eq(m:kv_cacheable(), true, name)
    local prompt = torch.randint(1, V + 1, {3, 6})
    local full = m:generate(prompt, {max_new = 16, temperature = 0, kv_cache = false})
    local cached = m:generate(prompt, {max_new = 16, temperature = 0, kv_cache = true})
    H.identical(cached, full, name .. ': greedy tokens')
    -- the model fed piece by piece under the cache against one forward of the whole
    local whole = torch.no_grad(function() return m(full) end)
    m:kv_cache(true)
    local parts = torch.no_grad(function()
      local p = {m(full:narrow(2, 1, 6)), m(full:narrow(2, 7, 3))}
      for t = 10, full:size(2) do p[#p + 1] = m(full:narrow(2, t, 1)) end
      return p
    end)
    m:kv_cache(false)
    local d = (torch.cat(parts, 2) - whole):abs():max():item()
    print(('  %-36s largest logit difference %.3g'):format(name, d))
    -- float32 rounding grows with the logits' scale (Gemma 3's reach 35; without the fused kernel, LibTorch 1.13)
    local scale = math.max(1, whole:abs():max():item())
    assert(d <= 1e-5 * scale, ('%s: logits differ by %g (bound %g: 1e-5 of the largest logit, at least 1)'):format(name, d, 1e-5 * scale))
    -- sampling: the same seed, the same tokens
    H.identical(m:generate(prompt, {max_new = 8, seed = 5}), m:generate(prompt, {max_new = 8, seed = 5, kv_cache = false}), name .. ': sampled')
  end
end)

test('cached generation past the context: the cache is dropped and the context cropped, as without it', function()
  torch.manual_seed(2)
  local m = models.gpt{vocab = V, dim = 16, heads = 2, layers = 2, seq = 10, ffn = 32, norm = 'pre'}
  local prompt = torch.randint(1, V + 1, {2, 7})
  H.identical(m:generate(prompt, {max_new = 12, temperature = 0}), m:generate(prompt, {max_new = 12, temperature = 0, kv_cache = false}),
    'beyond seq = 10')
  -- and a model left cached by nothing: a plain forward afterwards sees positions from 1
  local x = torch.randint(1, V + 1, {2, 10})
  local a = torch.no_grad(function() return m(x) end)
  m:generate(prompt, {max_new = 2, temperature = 0})
  H.identical(torch.no_grad(function() return m(x) end), a, 'no cache left behind')
  -- nor by a generation that fails at its third step
  local calls = 0
  local h = probe.replace(m, 'blocks.1.resid_mid', function(t)
    calls = calls + 1
    if calls == 3 then error('stopped here') end
    return t
  end)
  H.raises_part(function() m:generate(prompt, {max_new = 5, temperature = 0}) end, 'stopped here')
  h:remove()
  H.identical(torch.no_grad(function() return m(x) end), a, 'no cache left behind by an error')
end)

test('generation with probes: an intervention acts at every step, return_cache gives each step', function()
  torch.manual_seed(3)
  local m = models.llama{vocab = V, dim = 32, heads = 4, layers = 2, ffn = 64, seq = 48}
  local prompt = torch.randint(1, V + 1, {2, 5})
  local plain = m:generate(prompt, {max_new = 10, temperature = 0})
  local h = probe.group{probe.ablate(m, 'blocks.1.self_attn.z'), probe.ablate(m, 'blocks.2.self_attn.z', {head = 2})}
  local ablated = m:generate(prompt, {max_new = 10, temperature = 0})
  local ablated_full = m:generate(prompt, {max_new = 10, temperature = 0, kv_cache = false})
  h:remove()
  H.identical(ablated, ablated_full, 'the ablation at every step, cached or not')
  -- zeroing the last residual stream leaves all-zero logits at every step: the first id each time
  h = probe.ablate(m, 'blocks.2.resid_post')
  local zeroed = m:generate(prompt, {max_new = 6, temperature = 0})
  h:remove()
  eq(zeroed:narrow(2, 6, 6):eq(1):all():item(), true, 'every step under the intervention')
  assert(not torch.equal(zeroed, plain:narrow(2, 1, 11)), 'and not what the model generates without it')
  -- each step's activations: the prompt first, then one position a step
  local ids, steps = m:generate(prompt, {max_new = 4, temperature = 0, return_cache = {'*.resid_post', '*.pattern'}})
  eq(#steps, 4)
  eq(steps[1]['blocks.1.resid_post']:size(), {2, 5, 32})
  eq(steps[2]['blocks.1.resid_post']:size(), {2, 1, 32})
  eq(steps[4]['blocks.2.self_attn.pattern']:size(), {2, 4, 1, 8}, 'the new position attends to all 8 before it and itself')
  -- the step's activation is the whole run's at that position
  local _, whole = probe.run_with_cache(m, ids:narrow(2, 1, 8))
  close(steps[4]['blocks.2.resid_post']:select(2, 1), whole['blocks.2.resid_post']:select(2, 8), 1e-5, 'step 4 = position 8')
  local _, full_steps = m:generate(prompt, {max_new = 2, temperature = 0, return_cache = true, kv_cache = false})
  eq(full_steps[2]['blocks.1.resid_post']:size(), {2, 6, 32}, 'without the cache each step holds the whole context')
  local n = 0
  for _, mod in m:named_modules() do for _ in pairs(rawget(mod, '_probes') or {}) do n = n + 1 end end
  eq(n, 0, 'nothing left attached')
end)

test('generate checks its options; kv_cache = true on a model that cannot is an error saying why', function()
  local m = models.gpt{vocab = V, dim = 16, heads = 2, layers = 1, seq = 8, ffn = 32}
  local p = torch.randint(1, V + 1, {1, 3})
  raises(function() m:generate(p, {max_tokens = 3}) end, "generate: unknown option 'max_tokens' (expected attention_mask, kv_cache, max_new, return_cache, seed, temperature, top_k)")
  raises(function() m:generate(p, {max_new = -1}) end, 'generate: max_new must be a whole number >= 0, got -1')
  raises(function() m:generate(p, {temperature = 0 / 0}) end, 'generate: temperature must be a finite number >= 0, got nan')
  raises(function() m:generate(p, {top_k = 0}) end, 'generate: top_k must be a whole number >= 1, got 0')
  raises(function() m:generate(p, {kv_cache = 'yes'}) end, 'generate: kv_cache must be true or false, got yes')
  local vibe = models.vibenet{vocab = V, dim = 16, layers = 1, seq = 8}
  H.raises_part(function() vibe:generate(p, {kv_cache = true}) end, 'generate: kv_cache = true, but models.VibeNet does not declare that its positions come from its blocks')
  eq(vibe:generate(p, {max_new = 2, temperature = 0}):size(), {1, 5}, 'unset: the whole context, as before')
end)

H.done()
