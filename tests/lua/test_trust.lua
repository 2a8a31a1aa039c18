-- No silent wrong numbers: interventions that probe.clear removes whatever
-- attached them, options checked when given, checkpoint names that mean one
-- thing, and sizes that refuse a nil. Each test here returned a plausible
-- wrong number (or accepted a wrong option) without a word before its fix.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require 'harness'
local test, eq = H.test, H.eq

-- fn raises an error whose message contains `part` (these messages go on
-- with details that the test does not pin)
local function raises(fn, part)
  local ok, err = pcall(fn)
  if ok then error('expected an error: ' .. part, 2) end
  if not tostring(err):find(part, 1, true) then
    error(('wrong error\n  got:      %s\n  expected: ...%s...'):format(tostring(err), part), 2)
  end
end
local json = require 'anatomy.io.json'
local fs = require 'anatomy.io.fs'

-- bit-identical: the largest difference is printed when it is not 0
local function identical(got, want, what)
  local d = (got - want):abs():max():item()
  if d ~= 0 then error(('%s: the output differs from the clean one by up to %.6g'):format(what, d), 2) end
end

-- A Lua block that publishes a hook point of its own through self:hook.
local Mix = nn.block('trust.Mix', function(self, dim) self.fc = nn.Linear(dim, dim) end)
Mix.hook_names = {'mid'}
function Mix:forward(x) return x + self:hook('mid', self.fc(x)):tanh() end

local function model()
  torch.manual_seed(7)
  local m = models.gpt{vocab = 10, dim = 16, heads = 2, layers = 2, seq = 8, ffn = 32}
  m.mix = Mix(16)  -- a Lua block beside the built-in ones (not in the forward; run below by hand)
  return m
end

test('probe.clear removes every intervention kind from every point kind: the output is bit-identical again', function()
  local m = model()
  local ids = torch.randint(1, 11, {3, 8})
  local x = torch.randn(3, 8, 16)
  local function run() return torch.no_grad(function() return m(ids) end), torch.no_grad(function() return m.mix(x) end) end
  local clean, clean_mix = run()
  local _, cache = probe.run_with_cache(m, torch.randint(1, 11, {3, 8}))
  -- point kinds: a module output, a built-in block's hook point, a Lua block's self:hook point
  local points = {{'blocks.1.mlp', nil}, {'blocks.1.attn.z', 1}, {'mix.mid', nil}}
  local kinds = {
    zero = function(p, h) return probe.ablate(m, p, {head = h}) end,
    mean = function(p, h) return probe.ablate(m, p, {kind = 'mean', over = ids, head = h}) end,
    resample = function(p, h) return probe.ablate(m, p, {kind = 'resample', over = ids, head = h, seed = 3}) end,
    set = function(p, h) return probe.set(m, p, 0.5, {head = h}) end,
    patch = function(p, h)
      if p == 'mix.mid' then return probe.patch(m, p, torch.ones(3, 8, 16)) end
      return probe.patch(m, p, cache, {head = h})
    end,
    replace = function(p) return probe.replace(m, p, function(t) return t * 3 end) end,
    capture = function(p) local _, h = probe.attach_capture(m, {filter = p}); return h end,
    idle = function(p) if not p:find('%.z$') and not p:find('%.mid$') then return probe.idle(m, p) end end,
    skip = function(p) if p == 'blocks.1.mlp' then return probe.skip(m, p) end end,
  }
  local names = {}
  for k in pairs(kinds) do names[#names + 1] = k end
  table.sort(names)
  for _, kind in ipairs(names) do
    for _, pt in ipairs(points) do
      if not (pt[1] == 'mix.mid' and (kind == 'mean' or kind == 'resample')) then  -- mix is not in m's forward: no reference
        local h = kinds[kind](pt[1], pt[2])
        if h then
          local out, out_mix = run()
          if kind ~= 'capture' and kind ~= 'idle' then
            local changed = (pt[1] == 'mix.mid') and (out_mix - clean_mix):abs():max():item() or (out - clean):abs():max():item()
            assert(changed > 0, kind .. ' on ' .. pt[1] .. ' changed nothing: the test would not see it stay')
          end
          probe.clear(m)
          local after, after_mix = run()
          identical(after, clean, kind .. ' on ' .. pt[1] .. ', after probe.clear')
          identical(after_mix, clean_mix, kind .. ' on ' .. pt[1] .. ' (the Lua block), after probe.clear')
          h:remove()  -- a handle whose probes were cleared removes nothing, harmlessly
        end
      end
    end
  end
  for n, mod in m:named_modules() do
    for _, f in ipairs{'_probes', '_probe', '_hooks', '_hook_entries', '_hooks_wanted'} do
      eq(rawget(mod, f), nil, ("'%s' left on '%s'"):format(f, n))
    end
  end
end)

test('the example of the report: probe.clear after an ablation of one head', function()
  local m = models.gpt{vocab = 10, dim = 16, heads = 2, layers = 1, seq = 8, ffn = 32}
  local ids = torch.randint(1, 11, {1, 8})
  local ref = m(ids)
  probe.ablate(m, 'blocks.1.attn.z', {head = 1})
  probe.clear(m)
  eq((m(ids) - ref):abs():max():item(), 0)
end)

test('patching.run leaves nothing attached, also when the metric raises', function()
  torch.manual_seed(7)
  local m = models.gpt{vocab = 10, dim = 16, heads = 2, layers = 2, seq = 8, ffn = 32}
  local clean, corrupt = torch.randint(1, 11, {1, 8}), torch.randint(1, 11, {1, 8})
  local before = torch.no_grad(function() return m(clean) end)
  patching.run(m, clean, corrupt, function(logits) return logits[1][-1][1]:item() end, {over = 'attn.z', per = 'head'})
  raises(function() patching.run(m, clean, corrupt, function() error('metric failed') end) end, 'metric failed')
  identical(torch.no_grad(function() return m(clean) end), before, 'after patching')
  for n, mod in m:named_modules() do eq(rawget(mod, '_hook_entries'), nil, n) eq(rawget(mod, '_probes'), nil, n) end
end)

test('head, position and kind are checked when the intervention is attached', function()
  local m = models.gpt{vocab = 10, dim = 16, heads = 4, layers = 1, seq = 8, ffn = 32}
  raises(function() probe.ablate(m, 'blocks.1.attn.z', {head = 5}) end,
    'probe.ablate: head must be an integer in 1..4 for blocks.1.attn.z (blocks.1.attn has 4 heads), got 5')
  raises(function() probe.set(m, 'blocks.1.attn.pattern', 0, {head = 5}) end, 'head must be an integer in 1..4')
  raises(function() probe.patch(m, 'blocks.1.attn.q', torch.zeros(1, 8, 4, 4), {head = 9}) end, 'head must be an integer in 1..4')
  raises(function() probe.ablate(m, 'blocks.1.mlp', {position = 9}) end,
    'probe.ablate: position must be an integer in 1..8 (or -8..-1) for blocks.1.mlp (the model takes at most 8 positions), got 9')
  raises(function() probe.ablate(m, 'blocks.1.attn.z', {position = -9}) end, 'position must be an integer in 1..8')
  raises(function() probe.ablate(m, 'blocks.1.attn.z', {kind = 'average'}) end,
    "probe.ablate: kind must be 'zero', 'mean' or 'resample', got 'average'")
  raises(function() probe.ablate(m, 'blocks.1.attn.z', {head = 1.5}) end, 'head must be a positive integer, got 1.5')
  -- nothing was attached by the refused calls
  for n, mod in m:named_modules() do eq(rawget(mod, '_hook_entries'), nil, n) eq(rawget(mod, '_probes'), nil, n) end
  -- a VibeNet's attention has one head; grouped keys have kv_heads
  local v = models.vibenet{vocab = 10, dim = 8, layers = 1, seq = 8}
  raises(function() probe.ablate(v, 'blocks.1.inner.attn.pattern', {head = 2}) end, 'head must be an integer in 1..1')
  local a = nn.RoPEAttention(16, 4, {kv_heads = 2})
  eq({a:num_heads('q'), a:num_heads('k'), a:num_heads('z')}, {4, 2, 4})
end)

test('a mean ablation over one example is refused: it would change nothing', function()
  local m = model()
  raises(function() probe.ablate(m, 'blocks.1.attn.z', {kind = 'mean', over = torch.randint(1, 11, {1, 8})}) end,
    "probe.ablate: kind = 'mean' over a reference batch of one example would put that example's own activation back")
  local _, one = probe.run_with_cache(m, torch.randint(1, 11, {1, 8}))
  raises(function() probe.ablate(m, 'blocks.1.mlp', {kind = 'mean', over = one}) end, 'the mean of one example is the example')
end)

-- A GPT-2 checkpoint folder written here: config.json and safetensors in
-- GPT2LMHeadModel's names.
local function gpt2_folder(extra)
  local C, L, V, P = 8, 2, 11, 16
  local t = H.gpt2_tensors('transformer.', {C = C, L = L, V = V, P = P})
  local dir = H.tmpdir()
  local cfg = {model_type = 'gpt2', vocab_size = V, n_positions = P, n_embd = C,
    n_layer = L, n_head = 2, activation_function = 'gelu_new', layer_norm_epsilon = 1e-5}
  for k, v in pairs(extra or {}) do cfg[k] = v end
  fs.write_atomic(dir .. '/config.json', json.encode(cfg))
  torch.save_safetensors(dir .. '/model.safetensors', t)
  return dir
end

test("a checkpoint's names work in caches, over =, patching and layer arguments", function()
  local dir = gpt2_folder()
  local m = models.from_pretrained(dir)
  local ids = torch.randint(1, 12, {4, 6})
  local _, cache = probe.run_with_cache(m, ids)
  eq(cache['transformer.h.0.attn.z'], cache['h.1.attn.z'], 'cache lookup in the checkpoint spelling')
  eq(cache['transformer.h.1'], cache['h.2'])
  local mean_mix = probe.ablate(m, 'transformer.h.0.attn.z', {kind = 'mean', over = cache})
  local a = torch.no_grad(function() return m(ids) end)
  mean_mix:remove()
  local same = probe.ablate(m, 'h.1.attn.z', {kind = 'mean', over = cache})
  local b = torch.no_grad(function() return m(ids) end)
  same:remove()
  identical(a, b, 'the mean ablation named either way')
  eq(cache:heads('pattern', 'transformer.h.1'):size(), cache:heads('pattern', 'h.2'):size())
  local p = probe.patch(m, 'transformer.h.1.mlp', cache)
  p:remove()
  -- the attribution holds each norm's scale while it reads out, and lets go after
  local before = torch.no_grad(function() return m(ids) end)
  probe.logit_attribution(m, ids, 3)
  identical(torch.no_grad(function() return m(ids) end), before, 'after the attribution')
  for n, mod in m:named_modules() do eq(rawget(mod, '_hook_entries'), nil, n) eq(rawget(mod, '_probes'), nil, n) end
  -- the autopsy's layer arguments
  local a = autopsy.run(m, {ids, torch.randint(1, 12, {4, 6})})
  eq(a.rows[2].hf_name, 'transformer.h.0')
  eq(tostring(a:attention('transformer.h.0', 1)), tostring(a:attention('h.1', 1)))
  raises(function() a:attention('h.0', 1) end, "write 'h.1', or the checkpoint's own name 'transformer.h.0'")
  os.execute("rm -rf '" .. dir .. "'")
end)

test("h.0 is no anatomy name: an error with both spellings, never the first layer twice", function()
  local dir = gpt2_folder()
  local m = models.from_pretrained(dir)
  local msg = "'h.0.attn': anatomy counts layers from 1, so a layer 0 is no anatomy name: write 'h.1.attn', "
    .. "or the checkpoint's own name 'transformer.h.0.attn'"
  raises(function() probe.resolve_name(m, 'h.0.attn') end, msg)
  raises(function() probe.ablate(m, 'h.0.attn.z', {head = 1}) end, "write 'h.1.attn.z', or the checkpoint's own name 'transformer.h.0.attn.z'")
  raises(function() probe.skip(m, 'h.0') end, "write 'h.1', or the checkpoint's own name 'transformer.h.0'")
  local _, cache = probe.run_with_cache(m, torch.randint(1, 12, {1, 4}))
  raises(function() return cache['h.0.mlp'] end, "write 'h.1.mlp'")
  eq(probe.resolve_name(m, 'h.1'), 'h.1')
  eq(probe.resolve_name(m, 'transformer.h.0'), 'h.1')
  eq(probe.resolve_name(m, 'transformer.h.1'), 'h.2')
  os.execute("rm -rf '" .. dir .. "'")
end)

test('a nil, NaN, fractional or negative size is an error naming the argument', function()
  raises(function() torch.randn(nil, 3) end, "bad argument #1 to 'randn' (size expected, got nil (a size is missing))")
  raises(function() torch.ones(2, nil, 3) end, "bad argument #2 to 'ones' (size expected, got nil (a size is missing))")
  raises(function() torch.zeros(2, nil) end, "bad argument #2 to 'zeros' (size expected, got nil")
  raises(function() torch.zeros(nil) end, "bad argument #1 to 'zeros' (size expected, got nil")
  raises(function() torch.zeros({2, nil, 3}) end, "bad argument #1 to 'zeros' (the size list has a hole: entry 2 is nil but entry 3 is not)")
  raises(function() torch.zeros(0 / 0) end, "bad argument #1 to 'zeros' (integer expected")
  raises(function() torch.zeros(2.5) end, "bad argument #1 to 'zeros' (integer expected, got 2.5)")
  raises(function() torch.zeros(-1) end, "sizes must be non-negative")
  raises(function() torch.zeros({2, 0 / 0}) end, 'entry 2 is not')
  local x = torch.ones(2, 3)
  raises(function() x:view(nil, 6) end, "bad argument #1 to 'view' (size expected, got nil")
  raises(function() x:view(6, nil) end, "bad argument #2 to 'view' (size expected, got nil")
  raises(function() x:reshape(3, nil) end, "bad argument #2 to 'reshape' (size expected, got nil")
  raises(function() x:expand(nil, 2, 3) end, "bad argument #1 to 'expand' (size expected, got nil")
  raises(function() x:tile(2, nil, 2) end, "bad argument #2 to 'tile' (size expected, got nil")
  raises(function() x:permute(2, nil) end, "bad argument #2 to 'permute' (size expected, got nil")
  raises(function() x:view({3, nil, 2}) end, 'the size list has a hole')
  raises(function() torch.tensor({1, nil, 3}) end, 'the nested table has a hole: entry 2 is nil but entry 3 is not')
  raises(function() return x[{1, nil, 2}] end, 'bad index (the index table has a hole')
  raises(function() torch.cat({x, nil, x}) end, 'entry 2 is nil')
  -- a key no integer type holds (found by the Lua-API fuzzer under UBSan: the message cast it to long long)
  raises(function() torch.tensor({1, 2, [1e308] = 3}) end, 'the nested table has a hole: entry 3 is nil but entry 1e+308 is not')
  -- what still works
  eq(torch.zeros(2, 3):size(), {2, 3})
  eq(torch.zeros({2, 3}, {dtype = 'float64'}).dtype, 'float64')
  eq(torch.zeros(2, 3, {dtype = 'int64'}).dtype, 'int64')
  eq(x:view(-1):size(), {6})
  eq(torch.zeros():dim(), 0)
end)

test('a size metatable function called with anything is an error, not a crash', function()
  local tostring_size = getmetatable(torch.ones(2):size()).__tostring
  for _, v in ipairs{4, -1, 'x', true, torch.ones(2)} do
    raises(function() return tostring_size(v) end, 'table expected')
  end
  eq(tostring_size({2, 'a', {}}), '{2, string, table}')
  eq(tostring(torch.ones(2, 3):size()), '{2, 3}')
end)

-- A small gated VibeNet, trained a little, with batches to dissect it on.
local function gated()
  torch.manual_seed(1)
  local corpus = data.from_string(string.rep('the quick brown fox jumps over the lazy dog. ', 60))
  local m = models.vibenet{vocab = corpus.vocab_size, dim = 16, layers = 3, seq = 16, block = 'gate'}
  train.fit(m, corpus, {steps = 30, batch = 8, lr = 3e-3, quiet = true})
  local x, y = corpus:batch(4, 16, {split = 'val'})
  return m, x, y
end

-- The loss of a gated VibeNet with block i's forward replaced by step(block, x).
local function loss_by_hand(m, x, y, i, step)
  return torch.no_grad(function()
    local h = m.embed(x)
    for j = 1, #m.blocks do h = j == i and step(m.blocks[j], h) or m.blocks[j](h) end
    return nn.functional.cross_entropy(m.head(m.act(m.expand(h))), y):item()
  end)
end

test("a gated block's f_removal_loss keeps the gate, gate_identity_loss puts x back, and the verdict is f's own", function()
  local m, x, y = gated()
  local a = autopsy.run(m, {x, y})
  local blocks = {}
  for _, r in ipairs(a.rows) do if r.kind == 'block' then blocks[#blocks + 1] = r end end
  for i, r in ipairs(blocks) do
    local f_zeroed = loss_by_hand(m, x, y, i, function(b, h) return b.gate(h) end)
    local gate_is_identity = loss_by_hand(m, x, y, i, function(b, h) return h + b.inner(h) end)
    local skipped = loss_by_hand(m, x, y, i, function(_, h) return h end)
    H.close(r.f_removal_loss, f_zeroed, 1e-5, r.name .. ' f_removal_loss')
    H.close(r.gate_identity_loss, gate_is_identity, 1e-5, r.name .. ' gate_identity_loss')
    H.close(r.removal_loss, skipped, 1e-5, r.name .. ' removal_loss (the whole block skipped, as before)')
    assert(r.f_residual ~= nil and r.f_residual > 0, 'f_residual measured')
  end
  -- f made zero in block 2: the gate alone carries it, so removing the block still costs a lot,
  -- but f does nothing: a passenger by f's own contribution
  torch.no_grad(function() m.blocks[2].inner.ffn.weight:zero_(); m.blocks[2].inner.ffn.bias:zero_() end)
  local b = autopsy.run(m, {x, y})
  local r2 = b.rows[3]
  eq(r2.name, 'blocks.2')
  H.close(r2.f_residual, 0, 1e-6, 'f_residual of a zero f')
  assert(r2.removal_loss - b.loss > 0.01 * b.loss, 'skipping the block (gate and all) raises the loss')
  eq(r2.verdict, 'passenger')
  -- the columns reach every output
  local text = tostring(b)
  for _, c in ipairs{'f_residual', 'f_removal_loss', 'gate_identity_loss'} do
    assert(text:find(c, 1, true), c .. ' in the table')
  end
  local dir = H.tmpdir()
  local html = H.read(b:report(dir .. '/r.html'))
  for _, c in ipairs{'<th>f_removal_loss</th>', '<th>gate_identity_loss</th>', '<th>gate_grad</th>', '<th>gate_identity</th>',
    'loss with f zeroed and the wrapper'} do
    assert(html:find(c, 1, true), c .. ' in the HTML')
  end
  local csv = H.read(b:csv(dir .. '/r.csv'))
  assert(csv:match('^[^\n]*f_removal_loss'), 'the CSV header')
  local decoded = json.decode(H.read(b:json(dir .. '/r.json')))
  H.close(decoded.rows[3].f_removal_loss, r2.f_removal_loss, 1e-9, 'JSON')
  local c = tostring(autopsy.compare{{'trained', a}, {'f zeroed', b}})
  assert(c:find('f_removal_loss', 1, true) and c:find('gate_identity_loss', 1, true) and c:find('gate_grad', 1, true), 'the comparison')
  os.execute("rm -rf '" .. dir .. "'")
end)

test('exploding is growth that compounds: an unconstrained hyper-connection stack fires, a pre-norm first block does not', function()
  torch.manual_seed(2)
  local V = 20
  local ids, y = torch.randint(1, V + 1, {4, 16}), torch.randint(1, V + 1, {4, 16})
  local h = models.vibenet{vocab = V, dim = 16, layers = 4, seq = 16, block = 'hyper', constraint = 'none'}
  torch.no_grad(function() for i = 1, 4 do h.blocks[i].res_logits:mul_(3) end end)
  local a = autopsy.run(h, {ids, y}, {metrics = {'residual'}})
  for _, r in ipairs(a.rows) do
    if r.kind == 'block' then
      assert(r.amplification > 2, r.name .. ' grows')
      eq(r.verdict, 'exploding', r.name)
    end
  end
  -- pre-norm GPT with a small embedding: the first block scales the stream up once, the rest do not
  torch.manual_seed(3)
  local g = models.gpt{vocab = V, dim = 32, heads = 2, layers = 4, seq = 16, ffn = 64}
  torch.no_grad(function() g.embed.weight:mul_(0.01); g.embed.pos_weight:mul_(0.01) end)
  local b = autopsy.run(g, {ids, y}, {metrics = {'residual'}})
  assert(b.rows[2].amplification > 2, 'the first block amplifies (' .. b.rows[2].amplification .. ')')
  for _, r in ipairs(b.rows) do
    if r.kind == 'block' then assert(r.verdict ~= 'exploding', r.name .. ' is not exploding') end
  end
  assert(tostring(b):find('exploding = amplification > 2 in this block and the one before or after it', 1, true), 'the rule under the table')
end)

test('the per-head entropy chart and the table come from the same batches', function()
  torch.manual_seed(5)
  local corpus = data.from_string(string.rep('to be or not to be, that is the question. ', 40))
  local m = models.gpt{vocab = corpus.vocab_size, dim = 16, heads = 4, layers = 2, seq = 16, ffn = 32}
  local a = autopsy.run(m, corpus, {batch = 4, steps = 3})
  for _, r in ipairs(a.rows) do
    if r.kind == 'block' then
      local heads, sum = a.entropy_heads[r.name], 0
      for _, v in ipairs(heads) do sum = sum + v end
      H.close(sum / #heads, r.entropy, 1e-9, r.name .. ': the mean of the heatmap row against the table')
    end
  end
end)

test('autopsies in one script each record their own start and wall time', function()
  torch.manual_seed(6)
  local ids, y = torch.randint(1, 11, {2, 8}), torch.randint(1, 11, {2, 8})
  local m = models.gpt{vocab = 10, dim = 16, heads = 2, layers = 1, seq = 8, ffn = 32}
  local a = autopsy.run(m, {ids, y})
  local t0 = torch._now()
  while torch._now() - t0 < 1.2 do end
  local b = autopsy.run(m, {ids, y})
  assert(b.provenance.wall_seconds < 1.0, ('the second autopsy took %.2f s by its record: the first one\'s time counted in'):format(
    b.provenance.wall_seconds))
  assert(a.provenance.started ~= b.provenance.started, 'two start times: ' .. a.provenance.started .. ' and ' .. b.provenance.started)
  local c = tostring(autopsy.compare{a, b})
  assert(c ~= nil)
end)

test('published provenance names data by file name and a relative path, never an absolute one', function()
  local provenance = require 'anatomy.io.provenance'
  local path = H.tmpfile(string.rep('some text for a corpus. ', 50))
  local corpus = data.text(path)
  local rec = provenance.record{corpus = corpus, config = {data = path, steps = 3}}
  eq(rec.data.path, path:match('[^/]+$'), 'a file outside the source tree: its name')
  eq(rec.config.data, path:match('[^/]+$'), "a script's --data=/abs/path")
  eq(rec.data.sha256, data.sha256(H.read(path)))
  local root = provenance.source_root()
  if root then eq(provenance.relative(root .. '/README.md'), 'README.md', 'inside the source tree: relative to it') end
  local line = provenance.line(rec)
  assert(not line:find('/tmp', 1, true) and not line:find('%s/'), 'no absolute path in: ' .. line)
  os.remove(path)
end)

test("a smoke run's verdicts say so, and a NaN never reaches a verdict", function()
  local Results = experiment.Results
  local r = Results.new('smoke', nil, true)
  r:add('a claim', '1.0', 1.0, 'reproduced')
  eq(r.rows[1].verdict, 'smoke run: not meaningful')
  local s = Results.new('real', nil, false)
  s:add('a NaN', '1.0', 0 / 0, 'differs')
  s:add('a NaN in a text', '1.0', ('circuit >= %.3f'):format(0 / 0), 'differs')
  s:add('fine', '1.0', 1.0, 'reproduced')
  eq({s.rows[1].verdict, s.rows[2].verdict, s.rows[3].verdict}, {'not meaningful (nan)', 'not meaningful (nan)', 'reproduced'})
  local o = Results.new('other text', {comparable = false, name = 'kjv.txt'}, true)
  o:add('c', 'p', 1, 'reproduced')
  eq(o.rows[1].verdict, 'smoke run: not meaningful; not comparable (data: kjv.txt)')
  -- the autopsy of a smoke run (experiment.config with --smoke=true) says it too
  experiment.config({x = 1}, {}, {'--smoke=true'})
  local m = models.gpt{vocab = 10, dim = 16, heads = 2, layers = 1, seq = 8, ffn = 32}
  local a = autopsy.run(m, {torch.randint(1, 11, {2, 8}), torch.randint(1, 11, {2, 8})})
  experiment.smoke = false
  eq(a.rows[2].verdict, 'smoke run: not meaningful')
  eq(autopsy.run(m, {torch.randint(1, 11, {2, 8}), torch.randint(1, 11, {2, 8})}).rows[2].verdict ~= 'smoke run: not meaningful', true)
end)

test('colour bars and axes get at least three readable ticks; zero and missing cells are drawn apart from small values', function()
  local charts = require 'anatomy.render.charts'
  for _, range in ipairs{{0.246, 0.254}, {0.2487, 0.2491}, {1, 1.001}, {0, 1}, {-3, 1e4}, {2.371, 2.378}} do
    local ticks = charts.nice_ticks(range[1], range[2], 4)
    assert(#ticks >= 3, ('%g..%g: %d ticks'):format(range[1], range[2], #ticks))
    for _, t in ipairs(ticks) do assert(t >= range[1] - 1e-12 and t <= range[2] + 1e-12, 'tick ' .. t .. ' inside the range') end
  end
  local fig = charts.heatmap('entropy', {'blocks.1', 'blocks.2'}, {'head 1', 'head 2'}, {{0.246, 0.254}, {0.25, 0.2501}}, false, {})
  local labels = {}
  for t in fig:gmatch('class="ytick" dy="3">([^<]+)<') do labels[#labels + 1] = t end
  assert(#labels >= 3, 'the colour bar has ' .. #labels .. ' tick labels: ' .. table.concat(labels, ', '))
  local seen = {}
  for _, l in ipairs(labels) do assert(not seen[l], 'two ticks read ' .. l); seen[l] = true end
  local log = charts.heatmap('grad', {'a', 'b'}, {'1', '2'}, {{1e-3, 0}, {nil, 2e-3}}, true, {})
  assert(log:find('class="zero"', 1, true) and log:find('<title>a, 2: 0</title>', 1, true), 'a zero cell on a log scale is marked')
  assert(log:find('class="missing"', 1, true) and log:find('b, 1: no value', 1, true), 'a missing cell is marked')
  assert(log:find('>no value</text>', 1, true) and log:find('class="cellkey"', 1, true), 'the key under the colour bar says so')
  local plain = charts.heatmap('grad', {'a'}, {'1', '2'}, {{1e-3, 2e-3}}, true, {})
  assert(not plain:find('cellkey', 1, true), 'no key when every cell has a colour')
end)

test("the comparison's depth charts label their axis with the rows' names", function()
  torch.manual_seed(8)
  local ids, y = torch.randint(1, 11, {2, 8}), torch.randint(1, 11, {2, 8})
  local m = models.gpt{vocab = 10, dim = 16, heads = 2, layers = 2, seq = 8, ffn = 32}
  local a, b = autopsy.run(m, {ids, y}), autopsy.run(m, {ids, y})
  local html = require('anatomy.render.page').embed(autopsy.compare{a, b}:html())
  local fig = html:match('grad_norm by depth.-</figure>')
  assert(fig, 'the grad_norm by depth chart')
  for _, name in ipairs{'embed', 'blocks.1', 'blocks.2', 'output'} do
    assert(fig:find('class="xtick" text-anchor="end">' .. name .. '<', 1, true), name .. ' labels the axis')
  end
end)

test("a checkpoint's dropout, which anatomy does not apply, is stated when the model prints", function()
  local dir = gpt2_folder{attn_pdrop = 0.1, resid_pdrop = 0.1, embd_pdrop = 0.05, summary_first_dropout = 0}
  local m = models.from_pretrained(dir)
  local text = tostring(m)
  assert(text:find('dropout of the checkpoint not applied (attn_pdrop=0.1, embd_pdrop=0.05, resid_pdrop=0.1)', 1, true), text)
  -- and indeed not applied: train mode gives the eval-mode output
  local ids = torch.randint(1, 12, {2, 6})
  m:train()
  local a = torch.no_grad(function() return m(ids) end)
  m:eval()
  identical(torch.no_grad(function() return m(ids) end), a, 'train mode against eval mode')
  os.execute("rm -rf '" .. dir .. "'")
  local quiet = models.from_pretrained(gpt2_folder())
  assert(not tostring(quiet):find('dropout', 1, true), 'no note without dropout')
end)

test('errors point at the right place: unknown keys first with the closest name, train.fit names its option, options tables are their own argument', function()
  local ok, err = pcall(function() return models.vibenet{vocab = 65, dimm = 64, layers = 2, seq = 32} end)
  assert(not ok)
  assert(err:find("models.vibenet: unknown config key 'dimm', did you mean 'dim'?", 1, true), err)
  assert(err:find('^[^:]*test_trust%.lua:%d+:'), 'at the caller\'s line: ' .. err)
  local corpus = data.from_string(string.rep('abc def ', 100))
  local m = models.gpt{vocab = corpus.vocab_size, dim = 16, heads = 2, layers = 1, seq = 8, ffn = 32}
  raises(function() train.fit(m, corpus, {lr = '3e-3'}) end, "train.fit: option lr must be a positive number, got the string '3e-3'")
  raises(function() train.fit(m, corpus, {steps = 2.5}) end, 'train.fit: option steps must be a positive integer, got 2.5')
  raises(function() train.fit(m, corpus, {lr = 0 / 0}) end, 'train.fit: option lr must be a positive number, got nan')
  raises(function() train.fit(m, corpus, {schedule = 'linear'}) end, "option schedule must be 'cosine' or 'constant'")
  raises(function() train.fit(m, corpus, {betas = {0.9}}) end, 'option betas must be two numbers in [0, 1), got {0.9}')
  local x = torch.ones(2, 3)
  raises(function() return x:sum({dim = 3}) end, "bad argument #1 to 'sum' (option 'dim': dimension 3 out of range")
  raises(function() return x:clamp({min = 'a'}) end, "bad argument #1 to 'clamp' (option 'min': number expected, got string)")
end)

test('help() lists every global table, and every public function has documentation', function()
  local help = require 'anatomy.session.help'
  local std = {string = 1, table = 1, math = 1, io = 1, os = 1, debug = 1, coroutine = 1, package = 1, jit = 1, bit = 1,
    _G = 1, arg = 1, ffi = 1}
  local start = help.text()
  local globals = {}
  for k, v in pairs(_G) do if type(v) == 'table' and not std[k] then globals[#globals + 1] = k end end
  table.sort(globals)
  for _, g in ipairs{'torch', 'nn', 'models', 'data', 'train', 'probe', 'patching', 'autopsy', 'experiment', 'exact', 'dist', 'text'} do
    assert(type(_G[g]) == 'table', g .. ' is a global table')
  end
  for _, g in ipairs(globals) do
    assert(start:find('\n  ' .. g .. ' ', 1, true), "help() does not list the global table '" .. g .. "'")
  end
  for _, family in ipairs{'gpt2', 'llama', 'gpt_neox'} do require('anatomy.models.' .. family) end  -- loaded on first use
  local missing, seen = {}, {}
  local function walk(prefix, t, depth)
    if seen[t] or depth > 3 then return end
    seen[t] = true
    for k, v in pairs(t) do
      if type(k) == 'string' and not k:match('^_') then
        if type(v) == 'function' then
          if not help.doc(v) then missing[#missing + 1] = prefix .. k end
        elseif type(v) == 'table' and not torch.is_tensor(v) then
          walk(prefix .. k .. '.', v, depth + 1)
        end
      end
    end
  end
  for _, g in ipairs(globals) do walk(g .. '.', _G[g], 1) end
  table.sort(missing)
  eq(missing, {}, 'public functions without documentation')
  for _, name in ipairs{'nn.block', 'nn.call_child', 'nn.class', 'models.gpt'} do
    assert(not help.text(name):find('without documentation', 1, true), name)
  end
  local _, cache = probe.run_with_cache(models.gpt{vocab = 5, dim = 8, heads = 2, layers = 1, seq = 4, ffn = 8},
    torch.tensor({{1, 2}}, {dtype = 'int64'}))
  local h = help.text(cache)
  assert(h:find('probe.Cache', 1, true) and h:find('stack ', 1, true) and h:find('attention ', 1, true), h)
  torch.set_num_threads(1)
  assert(torch.banner():find(', 1 thread)', 1, true), torch.banner())
end)

test('every file reader says a directory is a directory, a FIFO is not a regular file, and a short read is short', function()
  local dir = H.tmpdir()
  local fifo = dir .. '/fifo'
  os.execute("mkfifo '" .. fifo .. "'")
  local model = models.gpt{vocab = 5, dim = 8, heads = 2, layers = 1, seq = 4, ffn = 8}
  local readers = {
    {'torch.load_safetensors', function(p) return torch.load_safetensors(p) end},
    {'torch.safe_open', function(p) return torch.safe_open(p) end},
    {'data.text', function(p) return data.text(p) end},
    {'data.file_info', function(p) return data.file_info(p) end},
    {'train.load_checkpoint', function(p) return train.load_checkpoint(p, model) end},
    {'train.read_metrics', function(p) return train.read_metrics(p) end},
  }
  for _, r in ipairs(readers) do
    raises(function() return r[2](dir) end, "'" .. dir .. "' is a directory")
    raises(function() return r[2](fifo) end, "'" .. fifo .. "' is not a regular file (a FIFO)")
  end
  -- the pieces of a checkpoint folder and a tokenizer folder, each a directory where a file belongs
  local folder = H.tmpdir()
  os.execute("mkdir '" .. folder .. "/config.json'")
  raises(function() models.from_pretrained(folder) end, 'config.json')
  raises(function() models.from_pretrained(folder) end, 'is a directory')
  local tok = H.tmpdir()
  os.execute("mkdir '" .. tok .. "/tokenizer.json'")
  raises(function() data.tokenizer(tok) end, 'is a directory')
  local sp = H.tmpdir()
  os.execute("mkdir '" .. sp .. "/tokenizer.model'")
  raises(function() data.tokenizer(sp) end, 'is a directory')
  -- a file whose size says more than a read gives (sysfs): the reader counts what came
  local short = '/sys/devices/system/cpu/online'
  if require('anatomy.io.fs').exists(short) then
    raises(function() torch.load_safetensors(short) end, 'of the 8 bytes of the header length could be read')
    raises(function() data.tokenizer(short) end, 'bytes came')
  end
  os.execute("rm -rf '" .. dir .. "' '" .. folder .. "' '" .. tok .. "' '" .. sp .. "'")
end)

test("a metatable's C functions called by hand, with anything, again: errors, never a crash", function()
  local samples = {torch.ones(2), exact.Q('3/2'), data.from_string(('abc '):rep(30)), torch.ones(2):size()}
  for _, v in ipairs(samples) do
    local mt = debug.getmetatable(v)
    for key, f in pairs(mt) do
      if type(f) == 'function' and key ~= '__gc' then
        for _, junk in ipairs{4, -1, 'x', {}, true, exact.Q(2), torch.ones(1)} do pcall(f, junk) pcall(f, junk, junk) end
      end
    end
    if mt.__gc then
      for _, junk in ipairs{4, 'x', {}, torch.ones(1):size()} do mt.__gc(junk) end  -- nothing to free: nothing happens
    end
  end
  -- a tensor freed by hand: a later use is an error, a second free and the collector do nothing
  local t = torch.ones(3)
  local gc = debug.getmetatable(t).__gc
  gc(t)
  gc(t)
  raises(function() return t + 1 end, 'attempt to perform arithmetic')
  raises(function() return torch.zeros(2):add(t) end, 'Tensor or number expected, got userdata')
  local c = data.from_string(('abc '):rep(30))
  debug.getmetatable(c._native).__gc(c._native)
  raises(function() return c:tokens() end, "attempt to index field '_native'")
  collectgarbage()
  collectgarbage()
  eq(torch.ones(2):sum():item(), 2, 'the session goes on')
end)

H.done()
