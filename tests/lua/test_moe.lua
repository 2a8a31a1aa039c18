-- nn.MoE on its own: top-k routing against a dense reference computed here
-- (every expert on every token, the top k by sorting the router's
-- probabilities), with and without norm_topk_prob; its gradients; the
-- expert_out point; bfloat16; and the errors for bad arguments.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, close, raises = H.test, H.eq, H.close, H.raises

-- The dense reference: x (B, T, C) -> (B, T, C), each expert run on every
-- token, weighted by the router's top-k probabilities (zero off the top k)
local function dense(m, x, norm)
  local B, T, C = x:size(1), x:size(2), x:size(3)
  local E, K = m.num_experts, m.top_k
  local probs = nn.functional.linear(x, m.gate.weight):softmax(-1)  -- (B, T, E)
  local sorted, order = probs:sort(-1, true)
  local top = sorted:narrow(3, 1, K)
  if norm then top = top / top:sum(-1, true) end
  local weights = torch.zeros(B, T, E):scatter(3, order:narrow(3, 1, K), top)  -- (B, T, E)
  local out = torch.zeros(B, T, C)
  for e = 1, E do out = out + m.experts[e](x) * weights:narrow(3, e, 1) end
  return out, weights
end

test('top-k routing equals the dense reference, norm_topk_prob on and off, every k', function()
  for _, norm in ipairs{true, false} do
    for k = 1, 4 do
      torch.manual_seed(10 * k + (norm and 1 or 0))
      local m = nn.MoE(8, 12, 4, k, {norm_topk_prob = norm})
      torch.no_grad(function() m.gate.weight:mul_(8) end)  -- decided routing: no near ties
      local x = torch.randn(3, 7, 8)
      local got = torch.no_grad(function() return m(x) end)
      local want, weights = torch.no_grad(function() return dense(m, x, norm) end)
      close(got, want, 1e-5, ('k = %d, norm_topk_prob = %s'):format(k, tostring(norm)))
      eq(weights:gt(0):sum(-1):max():item(), k, 'experts with a weight per token')
      if norm then close(weights:sum(-1), torch.ones(3, 7), 1e-6, 'renormalised weights') end
    end
  end
end)

test('without renormalising, top-1 output is the chosen expert scaled by its probability, not the expert alone', function()
  torch.manual_seed(3)
  local m = nn.MoE(6, 10, 3, 1, {norm_topk_prob = false})
  local x = torch.randn(1, 5, 6)
  local scaled = torch.no_grad(function() return m(x) end)
  m.norm_topk_prob = true
  local whole = torch.no_grad(function() return m(x) end)
  local p = nn.functional.linear(x, m.gate.weight):softmax(-1):max(-1)  -- (1, 5) the top probability
  close(scaled, whole * p:unsqueeze(-1), 1e-6, 'output = top probability x the expert')
  assert((scaled - whole):abs():max():item() > 1e-3, 'norm_topk_prob changes the output')
end)

test('gradients reach the router, the chosen experts and the input as the dense reference\'s', function()
  torch.manual_seed(4)
  local m = nn.MoE(8, 12, 4, 2)
  local x = torch.randn(2, 5, 8, {requires_grad = true})
  m(x):pow(2):sum():backward()
  local gx, gg = x.grad:clone(), m.gate.weight.grad:clone()
  local function expert_grad()
    for n, p in m:named_parameters() do if n == 'experts.1.down.weight' then return p.grad end end
  end
  local g1 = expert_grad():clone()
  x.grad = nil
  m:zero_grad()
  dense(m, x, true):pow(2):sum():backward()
  close(gx, x.grad, 1e-5, 'input gradient')
  close(gg, m.gate.weight.grad, 1e-5, 'router gradient')
  assert(gg:abs():max():item() > 0, 'the router has a gradient')
  close(g1, expert_grad(), 1e-5, 'expert 1 gradient')
end)

test('expert_out: each expert\'s weighted share, summing to the output; a share changed there changes the output', function()
  torch.manual_seed(5)
  local m = nn.MoE(8, 12, 4, 2)
  local x = torch.randn(2, 6, 8)
  local names = {}
  for _, p in ipairs(nn.declared_points(m)) do names[#names + 1] = p.name .. ':' .. table.concat(p.layout, ',') .. ':' .. p.cost end
  eq(names, {'input:batch,pos,d_model:free', 'router_logits:batch,pos,expert:free', 'expert_weights:batch,pos,slot:free',
    'expert_indices:batch,pos,slot:free', 'expert_out:batch,pos,expert,d_model:asked'})
  eq(m.block_role, 'mlp')
  local plain = torch.no_grad(function() return m(x) end)
  local _, weights = torch.no_grad(function() return dense(m, x, true) end)
  local shares
  local out = probe.run_with_hooks(m, x, {{'expert_out', function(t) shares = t:clone(); return t end}})
  eq(shares:size(), {2, 6, 4, 8}, 'expert_out shape')
  close(shares:sum(3), plain, 1e-6, 'shares sum to the output')
  close(out, plain, 1e-6, 'hooked output')
  eq(shares:abs():sum(-1):gt(0):float():sum():item(), weights:gt(0):float():sum():item(), 'non-zero shares where routed')
  local cut = probe.run_with_hooks(m, x, {{'expert_out', function(t)
    local z = t:clone(); z:narrow(3, 1, 1):fill_(0); return z end}})
  close(cut, plain - shares:narrow(3, 1, 1):squeeze(3), 1e-6, 'expert 1 removed')
end)

test('expert_weights and expert_indices: the routing (B, T, K); patched, the output follows them; no index tensor refused', function()
  torch.manual_seed(6)
  local m = nn.MoE(8, 12, 4, 2)
  torch.no_grad(function() m.gate.weight:mul_(8) end)
  local x = torch.randn(2, 5, 8)
  local plain = torch.no_grad(function() return m(x) end)
  local _, cache = probe.run_with_cache(m, x)
  local w, idx = cache['expert_weights'], cache['expert_indices']
  eq({w:size(), idx:size(), idx.dtype, w.dtype}, {{2, 5, 2}, {2, 5, 2}, 'int64', 'float32'})
  close(cache['input'], x, 0, 'input: what the block reads')
  local _, weights = torch.no_grad(function() return dense(m, x, true) end)  -- (B, T, E)
  close(weights:gather(3, idx), w, 1e-6, 'the weights of the chosen experts, 1-based')
  close(w:sum(-1), torch.ones(2, 5), 1e-6, 'renormalised')
  -- every token to experts 4 and 1, weighted 0.25 and 0.5 (as given, not renormalised)
  local to = torch.tensor({4, 1}):long():reshape(1, 1, 2):expand(2, 5, 2):contiguous()
  local out = torch.no_grad(function() return probe.run_with_hooks(m, x, {{'expert_indices', function() return to end},
    {'expert_weights', function(t) return torch.tensor({0.25, 0.5}):reshape(1, 1, 2):expand(2, 5, 2):contiguous() end}}) end)
  local want = torch.no_grad(function() return m.experts[4](x) * 0.25 + m.experts[1](x) * 0.5 end)
  close(out, want, 1e-5, 'routed as patched')
  assert((out - plain):abs():max():item() > 1e-3, 'the patch changes the output')
  for _, bad in ipairs{{to:float(), 'must hold whole numbers %(an integer tensor%), got float32'},
      {to * 0, 'must be experts 1..4 %(counted from 1%), got 0..0'}, {to + 1, 'must be experts 1..4 %(counted from 1%), got 2..5'},
      {to:narrow(3, 1, 1):expand(2, 5, 2):contiguous(), 'must name distinct experts for each token'}} do
    local ok, err = pcall(probe.run_with_hooks, m, x, {{'expert_indices', function() return bad[1] end}})
    assert(not ok and tostring(err):find('nn.MoE: expert_indices ' .. bad[2]), tostring(err))
  end
  local ok, err = pcall(probe.run_with_hooks, m, x, {{'expert_weights', function(t) return t:long() end}})
  assert(not ok and tostring(err):find('expert_weights must be floating point, got int64', 1, true), tostring(err))
  close(torch.no_grad(function() return m(x) end), plain, 0, 'unhooked again: as before')
end)

test('bfloat16: within bfloat16 rounding of float32', function()
  torch.manual_seed(6)
  local m = nn.MoE(8, 12, 4, 2)
  torch.no_grad(function() m.gate.weight:mul_(8) end)
  local x = torch.randn(2, 5, 8)
  local want = torch.no_grad(function() return m(x) end)
  m:to('bfloat16')
  local got = torch.no_grad(function() return m(x:to('bfloat16')) end)
  eq(got.dtype, 'bfloat16')
  close(got:float(), want, 0.05, 'bfloat16 output')
end)

test('a Mixtral from its config: saved and read back the same, floats kept floats; jitter noted; weight processing folds', function()
  local config = {model_type = 'mixtral', vocab_size = 50, hidden_size = 16, intermediate_size = 24, num_hidden_layers = 2,
    num_attention_heads = 4, num_key_value_heads = 2, num_local_experts = 3, num_experts_per_tok = 2, router_jitter_noise = 0}
  local m = models.from_config(config, {seed = 7})
  eq(nn.typename(m.blocks[1].mlp), 'nn.MoE')
  local n = 0
  for _, p in m:named_parameters() do n = n + p:numel() end
  eq(require('anatomy.models.llama').parameters(m.config), n, 'parameters implied (pretrained.check_size) and built')
  local dir = H.tmpdir()
  m:save_pretrained(dir)
  local text = H.read(dir .. '/config.json')
  assert(text:find('"router_jitter_noise":0.0', 1, true), 'router_jitter_noise written as a float: ' .. text)
  local back = models.from_pretrained(dir)
  local ids = torch.randint(1, 51, {2, 6})
  H.identical(back(ids), m(ids), 'read back')
  assert(not m:extra_repr():find('jitter'), 'no note without noise')
  config.router_jitter_noise = 0.25
  local noisy = models.from_config(config)
  assert(noisy:extra_repr():find('router_jitter_noise=0.25 not applied', 1, true), noisy:extra_repr())
  local folded = models.process_weights(models.from_pretrained(dir), {fold_ln = true})  -- into the router and experts (test_process)
  H.close(folded(ids), m(ids), 1e-5, 'fold_ln keeps the logits')
  config.num_experts_per_tok = 4
  H.raises_part(function() models.from_config(config) end, 'num_experts_per_tok = 4, which anatomy does not support (more than num_local_experts = 3)')
end)

test('bad arguments are errors naming the argument', function()
  raises(function() nn.MoE(8, 12, 4) end, 'nn.MoE(dim, hidden, experts, top_k, opts): top_k (argument 4) is missing')
  raises(function() nn.MoE(8, 12, 0, 1) end, 'nn.MoE(dim, hidden, experts, top_k, opts): experts must be a whole number >= 1, got 0')
  raises(function() nn.MoE(8, 12.5, 4, 1) end, 'nn.MoE(dim, hidden, experts, top_k, opts): hidden must be a whole number >= 1, got 12.5')
  raises(function() nn.MoE(8, 12, 4, 5) end, 'nn.MoE(dim, hidden, experts, top_k, opts): top_k must be at most experts (4), got 5')
  raises(function() nn.MoE(8, 12, 4, 2, {norm = true}) end,
    "nn.MoE(dim, hidden, experts, top_k, opts): unknown option 'norm' (expected bias, norm_topk_prob)")
  raises(function() nn.MoE(8, 12, 4, 2, {norm_topk_prob = 1}) end,
    'nn.MoE(dim, hidden, experts, top_k, opts): norm_topk_prob must be true or false, got 1')
end)

H.done()
