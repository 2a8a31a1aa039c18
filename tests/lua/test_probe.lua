-- Probes and the autopsy: captures, gradients, interventions, verdicts.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, close, raises = H.test, H.eq, H.close, H.raises

local function keys(t)
  local out = {}
  for k in pairs(t) do if k ~= 'grads' then out[#out + 1] = k end end
  table.sort(out)
  return out
end

test('capture records module outputs by dotted name, filtered by globs', function()
  torch.manual_seed(0)
  local m = models.vibenet{vocab = 20, dim = 16, layers = 2, seq = 8}
  local ids = torch.randint(1, 21, {2, 8})
  local cap, logits = probe.capture(m, {filter = {'blocks.*', '*.pattern'}}, function() return m(ids) end)
  -- a glob takes the hook points below too (the RMSNorm's scale, the residual's resid_pre)
  eq(keys(cap), {'blocks.1', 'blocks.1.inner', 'blocks.1.inner.attn', 'blocks.1.inner.attn.pattern', 'blocks.1.inner.attn.scores',
    'blocks.1.inner.attn.z', 'blocks.1.inner.norm', 'blocks.1.inner.norm.normalized', 'blocks.1.inner.norm.scale',
    'blocks.1.resid_post', 'blocks.1.resid_pre', 'blocks.2', 'blocks.2.inner', 'blocks.2.inner.attn', 'blocks.2.inner.attn.pattern',
    'blocks.2.inner.attn.scores', 'blocks.2.inner.attn.z', 'blocks.2.inner.norm', 'blocks.2.inner.norm.normalized',
    'blocks.2.inner.norm.scale', 'blocks.2.resid_post', 'blocks.2.resid_pre'})
  eq(logits:size(), {2, 8, 20}, 'fn results come back')
  -- the recorded values are the real intermediate values
  local x0 = m.embed(ids)
  close(cap['blocks.1.inner.norm'], m.blocks[1].inner.norm(x0), 1e-6)
  close(cap['blocks.1'], x0 + m.blocks[1].inner(x0), 1e-6)
  eq(cap['blocks.2.inner.attn.pattern']:size(), {2, 1, 8, 8})
  eq(cap['blocks.1'].requires_grad, false, 'captures are detached unless grad = true')
  -- after capture, no probe is left: the idle path is back
  for _, mod in m:named_modules() do
    eq(rawget(mod, '_probe'), nil)
    eq(rawget(mod, '_hooks'), nil)
  end
  eq(#probe.names(m), 27, '13 module outputs, and 14 hook points (attention: scores, pattern, z; norm; residual)')
end)

test('grad = true captures activation gradients', function()
  torch.manual_seed(1)
  local m = models.gpt{vocab = 12, dim = 8, heads = 2, layers = 2, seq = 6, ffn = 16}
  local ids, y = torch.randint(1, 13, {2, 6}), torch.randint(1, 13, {2, 6})
  local cap = probe.capture(m, {filter = 'blocks.*', grad = true}, function()
    nn.functional.cross_entropy(m(ids), y):backward()
  end)
  assert(cap.grads['blocks.1'] ~= nil and cap.grads['blocks.2'] ~= nil, 'gradients of both blocks')
  -- the same gradient by hand: d loss / d h2 through ln/head equals what retain_grad gives
  local h1 = m.blocks[1](m.embed(ids))
  local h2 = m.blocks[2](h1)
  h2:retain_grad()
  nn.functional.cross_entropy(m.head(h2), y):backward()
  close(cap.grads['blocks.2'], h2.grad, 1e-6)
  assert(cap.grads['blocks.1.attn.pattern'] ~= nil, 'pattern gradients too')
end)

test('a probe on a Lua-defined block works as on a built-in one', function()
  local Scale = nn.block('Scale', function(self, dim) self.w = nn.Parameter(torch.ones(dim) * 2) end)
  function Scale:forward(x) return x * self.w end
  local m = nn.Sequential{nn.Linear(4, 4), Scale(4), nn.Linear(4, 2)}
  local x = torch.randn(3, 4)
  local cap = probe.capture(m, {grad = true}, function() m(x):sum():backward() end)
  close(cap['2'], m[1](x) * 2, 1e-6)
  close(cap.grads['2'], torch.ones(3, 2):matmul(m[3].weight), 1e-6)
  local h = probe.replace(m, '2', function(a) return a * 0 end)
  close(m(x), m[3].bias:expand(3, 2), 1e-6, 'zeroing the Lua block leaves the last bias')
  h:remove()
  eq(rawget(m[2], '_probe'), nil)
end)

test('skipping every block of a residual model gives the embedding-to-head logits', function()
  torch.manual_seed(2)
  local m = models.vibenet{vocab = 20, dim = 16, layers = 3, seq = 8, block = 'ffn'}
  local ids = torch.randint(1, 21, {2, 8})
  local full = m(ids)
  local handles = {}
  for i = 1, 3 do handles[i] = probe.skip(m, 'blocks.' .. i) end
  close(m(ids), m.head(m.act(m.expand(m.embed(ids)))), 1e-6)
  probe.clear(m)
  close(m(ids), full, 0, 'clear restores the model')
end)

test('zero-ablation changes the loss; patching a run into itself does not', function()
  torch.manual_seed(3)
  local m = models.gpt{vocab = 12, dim = 8, heads = 2, layers = 2, seq = 6, ffn = 16}
  local ids, y = torch.randint(1, 13, {2, 6}), torch.randint(1, 13, {2, 6})
  local function loss() return nn.functional.cross_entropy(m(ids), y):item() end
  local base = loss()
  local cap = probe.capture(m, {filter = 'blocks.1.attn'}, function() m(ids) end)
  local h = probe.replace(m, 'blocks.1.attn', function(a) return torch.zeros_like(a) end)
  assert(math.abs(loss() - base) > 1e-4, 'zero-ablation changes the loss')
  h:remove()
  h = probe.replace(m, 'blocks.1.attn', function() return cap['blocks.1.attn'] end)
  close(loss(), base, 1e-6, 'patching in the same activation changes nothing')
  h:remove()
  raises(function() probe.skip(m, 'blocks.9') end, "no module or hook point named 'blocks.9' in models.GPT (modules: embed, blocks, blocks.1, blocks.1.attn, "
    .. "blocks.1.ln1, blocks.1.mlp, blocks.1.ln2, blocks.2, blocks.2.attn, blocks.2.ln1, blocks.2.mlp, blocks.2.ln2, ...; a block's hook points: probe.names(model))")
end)

test('batched ranks and norms agree with the one-at-a-time kernels', function()
  torch.manual_seed(3)
  local ws = {torch.randn(12, 7), torch.randn(7, 12), torch.randn(12, 7), torch.randn(5, 5):mul(0), torch.randn(9, 9)}
  local r = torch.metrics.eranks(ws)
  for i, w in ipairs(ws) do
    local want = torch.metrics.erank(w)
    assert(math.abs(r[i] - want) <= 1e-9 * math.max(want, 1), ('erank %d: %g vs %g'):format(i, r[i], want))
  end
  eq(r[4], 0, 'an all-zero matrix has rank 0')
  local n = torch.metrics.norms({ws[1], false, ws[5]})
  close(n[1], ws[1]:norm():item(), 1e-5)
  eq(n[2] ~= n[2], true, 'a missing tensor gives nan')
  close(n[3], ws[5]:norm():item(), 1e-5)
  raises(function() torch.metrics.eranks({torch.randn(3)}) end, "bad argument #1 to 'metrics.eranks' (effective_ranks: matrix 1 is not 2-D)")
end)

H.done()
