-- Hook points inside blocks, run_with_cache, interventions (one head, one
-- position), activation patching and direct logit attribution, each checked
-- against the same quantity computed by hand from the block's parameters.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, raises = H.test, H.eq, H.raises

local function close(a, b, tol, what)
  local d = (a - b):abs():max():item()
  if d > (tol or 1e-5) then error(('%s: differ by %g'):format(what or 'tensors', d), 2) end
end

local function tiny(norm)
  torch.manual_seed(0)
  local m = models.gpt{vocab = 13, dim = 16, heads = 4, layers = 2, seq = 8, ffn = 32, norm = norm or 'pre'}
  m:eval()
  return m
end

local function params(m)
  local out = {}
  for n, t in m:named_parameters() do out[n] = t end
  return out
end

local function ids(B, T, seed)
  torch.manual_seed(seed or 1)
  return torch.randint(1, 14, {B, T})
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

test('hook points are listed with the module outputs', function()
  local names = table.concat(probe.names(tiny()), ' ')
  for _, n in ipairs{'blocks.1.resid_pre', 'blocks.1.attn.q', 'blocks.1.attn.scores', 'blocks.1.attn.pattern', 'blocks.1.attn.z',
    'blocks.1.attn.result', 'blocks.1.mlp.pre', 'blocks.1.mlp.post', 'blocks.2.ln1.scale', 'blocks.2.resid_mid', 'ln_f.normalized'} do
    assert(names:find(n, 1, true), n .. ' is not listed')
  end
end)

test("an attention's per-head result is cached only when the filter names it", function()
  local m, x = tiny(), ids(2, 6)
  local plain = torch.no_grad(function() return m(x) end)
  local out, c = probe.run_with_cache(m, x)
  close(out, plain, 1e-5, 'output with every hook point but result')
  assert(c['blocks.1.attn.z'] ~= nil, 'z is cached by default')
  eq(c:get('blocks.1.attn.result'), nil)
  H.raises_part(function() return c['blocks.1.attn.result'] end, "probe cache: 'blocks.1.attn.result' is a point of the model the run did not record")
  for _, n in ipairs(c:names()) do assert(not n:find('result', 1, true), n .. ' cached without being asked for') end
  local _, all = probe.run_with_cache(m, x, {filter = {'*', '*.result'}})
  eq(all['blocks.1.attn.result']:size(), {2, 6, 4, 16})
  eq(#all:names(), #c:names() + 2)  -- one result per attention (two blocks)
  local _, one = probe.run_with_cache(m, x, {filter = 'blocks.2.attn.result'})
  eq(one:names(), {'blocks.2.attn.result'})
  -- a hook on result (not a capture) still gets it computed
  local seen
  local h = probe.replace(m, 'blocks.1.attn.result', function(t) seen = t:size() end)
  torch.no_grad(function() return m(x) end)
  h:remove()
  eq(seen, {2, 6, 4, 16})
end)

test('run_with_cache{grad = true}: a backward fills cache.grads; a dropped cache frees its tensors', function()
  local m, x = tiny(), ids(2, 6)
  local out, c = probe.run_with_cache(m, x, {grad = true})
  out:sum():backward()  -- the probes are gone; the gradient hooks write into the cache
  close(c.grads['head'], torch.ones(2, 6, 13), 0, "d sum / d head's output")
  -- the last block's: the same backward through ln_f and head alone
  local h = c['blocks.2']:detach():requires_grad_()
  m.head(m.ln_f(h)):sum():backward()
  close(c.grads['blocks.2'], h.grad, 1e-6, "d sum / d the last block's output")
  -- the capture table the call made is emptied: a stale reference to it
  -- (a LuaJIT stack slot) keeps nothing once the cache is gone
  local weak = setmetatable({}, {__mode = 'k'})
  local function run()
    local _, cache = probe.run_with_cache(m, x)
    for _, n in ipairs(cache:names()) do weak[cache[n]] = n end
  end
  run()
  for _ = 1, 3 do collectgarbage() end
  local left = {}
  for _, n in pairs(weak) do left[#left + 1] = n end
  eq(#left, 0, 'tensors still alive: ' .. table.concat(left, ' '))
end)

test('attention hook points equal the computation from the weights; hooked output equals the fused one', function()
  local m, x = tiny(), ids(2, 6)
  local plain = torch.no_grad(function() return m(x) end)
  local out, c = probe.run_with_cache(m, x, {filter = {'*', '*.result'}})
  close(out, plain, 1e-5, 'output with every hook point captured')
  local a = params(m.blocks[1].attn)
  local B, T, C, Hh, D = 2, 6, 16, 4, 4
  local xin = c['blocks.1.ln1']
  local qkv = xin:matmul(a['qkv.weight']:t()) + a['qkv.bias']
  local q = qkv:narrow(3, 1, C):reshape(B, T, Hh, D)
  local k = qkv:narrow(3, C + 1, C):reshape(B, T, Hh, D)
  local v = qkv:narrow(3, 2 * C + 1, C):reshape(B, T, Hh, D)
  close(c['blocks.1.attn.q'], q, 1e-5, 'q')
  close(c['blocks.1.attn.k'], k, 1e-5, 'k')
  close(c['blocks.1.attn.v'], v, 1e-5, 'v')
  eq(c['blocks.1.attn.scores']:size(), {B, Hh, T, T})
  close(c['blocks.1.attn.pattern'], torch.softmax(c['blocks.1.attn.scores'], -1), 1e-6, 'pattern = softmax(scores)')
  local z = c['blocks.1.attn.pattern']:matmul(v:transpose(2, 3)):transpose(2, 3)
  close(c['blocks.1.attn.z'], z, 1e-5, 'z')
  -- each head's result summed over heads, plus the output bias, is the attention's output
  close(c['blocks.1.attn.result']:sum(3) + a['proj.bias'], c['blocks.1.attn'], 1e-5, 'sum of results + bias')
  -- the residual stream: resid_post of a block is its output and the next block's resid_pre
  close(c['blocks.1.resid_post'], c['blocks.1'], 0, 'resid_post = block output')
  close(c['blocks.2.resid_pre'], c['blocks.1.resid_post'], 0, 'resid_pre = previous resid_post')
  close(c['blocks.1.resid_mid'], c['blocks.1.resid_pre'] + c['blocks.1.attn'], 1e-6, 'resid_mid')
  -- MLP: post = relu(pre); norms: scale = sqrt(var + eps)
  close(c['blocks.1.mlp.post'], torch.relu(c['blocks.1.mlp.pre']), 0, 'mlp post')
  local r = c['blocks.1.resid_pre']
  local centered = r - r:mean(-1, true)
  close(c['blocks.1.ln1.scale'], (centered:pow(2):mean(-1, true) + 1e-5):sqrt(), 1e-6, 'ln scale')
  close(c['blocks.1.ln1.normalized'], centered / c['blocks.1.ln1.scale'], 1e-6, 'ln normalized')
end)

test("VibeAttention's one head: scores, pattern, z on the composed path equal the fused block's", function()
  torch.manual_seed(2)
  local m = models.vibenet{vocab = 13, dim = 16, layers = 2, seq = 8, block = 'ffn'}
  m:eval()
  local x = ids(2, 7)
  local plain = torch.no_grad(function() return m(x) end)
  local out, c = probe.run_with_cache(m, x, {filter = {'*.attn', '*.attn.*', '*.norm'}})
  close(out, plain, 1e-5, 'output with the hook points on')
  local h = c['blocks.1.inner.norm']
  local scores = c['blocks.1.inner.attn.scores']
  eq(scores:size(), {2, 1, 7, 7})
  close(c['blocks.1.inner.attn.pattern'], torch.softmax(scores, -1), 1e-6, 'pattern')
  close(c['blocks.1.inner.attn.z']:squeeze(3), c['blocks.1.inner.attn.pattern']:squeeze(2):matmul(h), 1e-5, 'z = pattern x')
  close(c['blocks.1.inner.attn.z']:squeeze(3), c['blocks.1.inner.attn'], 0, 'z is the output')
  local hd = probe.set(m, 'blocks.2.inner.attn.pattern', 0, {position = 3})
  local _, c2 = probe.run_with_cache(m, x, {filter = 'blocks.2.inner.attn'})
  hd:remove()
  close(c2['blocks.2.inner.attn']:select(2, 3), torch.zeros(2, 16), 0, 'a zeroed query row attends to nothing')
end)

test('run_with_cache: text through a tokenizer, stack, heads, memory, attention map', function()
  local m = tiny()
  local corpus = data.from_string('abcdefghijklm', {tokenizer = 'char'})
  local _, c = probe.run_with_cache(m, 'cab', {tokenizer = corpus, filter = {'*.resid_post', '*.pattern'}})
  eq(c.ids:size(), {1, 3})
  eq(c.tokens[1], {'c', 'a', 'b'})
  eq(c:stack('resid_post'):size(), {2, 1, 3, 16})
  eq(c:heads('pattern', 2):size(), {4, 1, 3, 3})
  eq(c:memory(), 2 * 3 * 16 * 4 + 2 * 4 * 3 * 3 * 4)
  eq(#c:names(), 4)
  local fig = c:attention(1, 2, {numbers = true})
  local map = tostring(fig)
  assert(map:find('blocks.1 head 2', 1, true) and map:find('1.00', 1, true), map)
  assert(fig:svg():find('^<svg') and fig:svg():find('data-kind="attention"', 1, true), 'a heatmap for notebooks')
  assert(tostring(c):find('4 activations', 1, true))
  raises(function() c:stack('mlp.post') end, "cache:stack: the cache has no 'mlp.post' in layer blocks.1 (run_with_cache's filter left it out, or the layer does not publish it)")
  raises(function() probe.run_with_cache(m, 'cab') end, 'probe.run_with_cache: a text needs a tokenizer: pass {tokenizer = tok} (a data.tokenizer or a corpus), or use a model from models.from_pretrained')
end)

test('interventions: one head zeroed, set, patched, mean and resample; handles remove them', function()
  local m, x = tiny(), ids(3, 6)
  local _, c = probe.run_with_cache(m, x, {filter = {'blocks.1.attn', 'blocks.1.attn.result'}})
  local bias = params(m.blocks[1].attn)['proj.bias']
  local h = probe.ablate(m, 'blocks.1.attn.z', {head = 2})
  local _, c2 = probe.run_with_cache(m, x, {filter = 'blocks.1.attn'})
  h:remove()
  local result = c['blocks.1.attn.result']
  local kept = result:sum(3) - result:select(3, 2)
  close(c2['blocks.1.attn'], kept + bias, 1e-5, 'head 2 zero-ablated')
  -- one position only: the attention output before it is untouched
  h = probe.set(m, 'blocks.1.attn.z', 0, {position = 4})
  local _, c3 = probe.run_with_cache(m, x, {filter = 'blocks.1.attn'})
  h:remove()
  close(c3['blocks.1.attn']:narrow(2, 1, 3), c['blocks.1.attn']:narrow(2, 1, 3), 0, 'positions before 4')
  close(c3['blocks.1.attn']:select(2, 4), bias:expand(3, 16), 1e-6, 'position 4: only the bias left')
  -- patching the first layer's whole resid_pre from another run gives that run's output
  local y = ids(3, 6, 7)
  local out_y, cy = probe.run_with_cache(m, y, {filter = 'blocks.1.resid_pre'})
  h = probe.patch(m, 'blocks.1.resid_pre', cy)
  local patched = torch.no_grad(function() return m(x) end)
  h:remove()
  close(patched, out_y, 1e-5, 'patched from the other run')
  -- mean over a reference batch of identical rows is that row; resample from it likewise
  local same = x:narrow(1, 1, 1):expand(4, 6):clone()
  local base = torch.no_grad(function() return m(x:narrow(1, 1, 1)) end)
  for _, kind in ipairs{'mean', 'resample'} do
    h = probe.ablate(m, 'blocks.2.mlp.post', {kind = kind, over = same})
    close(torch.no_grad(function() return m(x:narrow(1, 1, 1)) end), base, 1e-5, kind .. ' over identical rows')
    h:remove()
  end
  -- composed interventions, removed together
  local g = probe.group{probe.ablate(m, 'blocks.1.attn.z', {head = 1}), probe.ablate(m, 'blocks.2.attn.pattern', {head = 3})}
  assert(rawget(m.blocks[1].attn, '_hooks') and rawget(m.blocks[2].attn, '_hooks'))
  g:remove()
  eq(rawget(m.blocks[1].attn, '_hooks'), nil)
  eq(rawget(m.blocks[2].attn, '_hooks'), nil)
end)

test('bad interventions are clear errors and leave the model working', function()
  local m, x = tiny(), ids(1, 5)
  local before = torch.no_grad(function() return m(x) end)
  raises(function() probe.replace(m, 'blocks.1.attn.w', function() end) end,
    "no hook point 'w' in blocks.1.attn (nn.Attention); its hook points: q, k, v, scores, pattern, z, result")
  raises(function() probe.replace(m, 'blocks.1.ln1.foo', function() end) end,
    "no hook point 'foo' in blocks.1.ln1 (nn.LayerNorm); its hook points: scale, normalized")
  raises(function() probe.replace(m, 'embed.q', function() end) end,
    "no hook point 'q' in embed (nn.Embedding): it has none (its output is the probe point 'embed')")
  raises(function() probe.replace(m, 'nowhere.q', function() end) end, "no module or hook point named 'nowhere.q' in models.GPT "
    .. "(probe.names(model) lists them; TransformerLens's names: probe.transformer_lens_names(model))")
  raises(function() probe.ablate(m, 'blocks.1.mlp.post', {head = 1}) end,
    "probe.ablate: 'blocks.1.mlp.post' has no head dimension (heads: q, k, v, rot_q, rot_k, scores, pattern, z, result)")
  -- the range is the block's: checked when attached (below)
  raises(function() probe.ablate(m, 'blocks.1.attn.z', {head = 5}) end,
    'probe.ablate: head must be an integer in 1..4 for blocks.1.attn.z (blocks.1.attn has 4 heads), got 5')
  raises(function() probe.ablate(m, 'blocks.1.attn.z', {kind = 'mean'}) end,
    "probe.ablate: kind = 'mean' needs over (the reference batch: ids or a cache)")
  raises(function() probe.set(m, 'blocks.1.attn.z', 'zero') end, 'probe.set: value must be a number or a Tensor, got string')
  -- a replacement of the wrong shape, and an error inside a hook: raised at the forward, the model intact after
  local h = probe.replace(m, 'blocks.1.attn.q', function(t) return t:narrow(2, 1, 2) end)
  raises(function() m(x) end, "probe: the replacement for 'blocks.1.attn.q' has shape 1x2x4x4, expected 1x5x4x4")
  h:remove()
  h = probe.replace(m, 'blocks.2.mlp.pre', function() error('boom in my hook') end)
  raises(function() m(x) end, 'boom in my hook')
  h:remove()
  h = probe.replace(m, 'blocks.2.resid_mid', function() return 'nope' end)
  raises(function() m(x) end, "probe: the replacement for 'blocks.2.resid_mid' is a string, not a Tensor")
  h:remove()
  close(torch.no_grad(function() return m(x) end), before, 0, 'the model after the errors')
end)

test('a Lua block publishes its own hook points with self:hook', function()
  local Twice = nn.block('test.Twice', function(self, dim) self.fc = nn.Linear(dim, dim) end)
  Twice.hook_names = {'mid'}
  function Twice:forward(x)
    local h = self:hook('mid', self.fc(x))
    return h * 2
  end
  torch.manual_seed(3)
  local m = nn.Sequential{Twice(4), Twice(4)}
  local x = torch.randn(2, 3, 4)
  local _, c = probe.run_with_cache(m, x, {filter = '*.mid'})
  close(c['1.mid'] * 2, m[1](x), 1e-6, 'mid of the first block')
  local h = probe.set(m, '2.mid', 1, {position = 2})
  local y = m(x)
  h:remove()
  close(y:select(2, 2), torch.ones(2, 4) * 2, 0, 'position 2 set to 1 then doubled')
  eq(table.concat(probe.names(m), ' '), '1 1.mid 1.fc 2 2.mid 2.fc')
  raises(function() probe.replace(m, '1.other', function() end) end, "no hook point 'other' in 1 (test.Twice); its hook points: mid")
end)

test('activation patching: whole resid_pre restores the clean metric in every layer; per head and position grids', function()
  local m = tiny()
  local clean, corrupt = ids(2, 6, 11), ids(2, 6, 12)
  local metric = patching.logit_diff(3, 5)
  local r = patching.run(m, clean, corrupt, metric, {over = 'resid_pre', per = 'layer'})
  eq(r.rows, {'blocks.1', 'blocks.2'})
  for i = 1, 2 do assert(math.abs(r.values[i][1] - r.clean) < 1e-5, ('layer %d: %g vs clean %g'):format(i, r.values[i][1], r.clean)) end
  local heads = patching.run(m, clean, corrupt, metric, {over = 'attn.z', per = 'head'})
  eq(heads.grid:size(), {2, 4})
  eq(heads.cols[4], 'head 4')
  local pos = patching.run(m, clean, corrupt, metric, {over = 'resid_post', per = 'position'})
  eq(pos.grid:size(), {2, 6})
  -- the last layer's resid_post at the last position is all the metric reads
  assert(math.abs(pos.values[2][6] - pos.clean) < 1e-5, ('pos.values[2][6] vs pos.clean: difference %.3g, tolerance 1e-5'):format(math.abs(pos.values[2][6] - pos.clean)))
  assert(math.abs(pos.values[2][1] - pos.corrupt) < 1e-5, ('pos.values[2][1] vs pos.corrupt: difference %.3g, tolerance 1e-5'):format(math.abs(pos.values[2][1] - pos.corrupt)))
  assert(tostring(heads):find('activation patching of attn.z per head', 1, true))
  local path = os.tmpname()
  heads:report(path)
  local html = io.open(path):read('*a')
  os.remove(path)
  assert(html:find('<svg', 1, true) and html:find('head 4', 1, true), 'the report has the labelled heatmap')
  raises(function() patching.run(m, clean, corrupt, metric, {over = 'resid_pre', per = 'head'}) end,
    "patching.run: per = 'head' needs a point with heads (attn.q, k, v, z, result, pattern, scores), got 'resid_pre'")
  raises(function() patching.run(m, clean, ids(2, 5), metric) end, 'patching.run: clean is 2x6 tokens and corrupt 2x5; they must have one shape')
end)

test('direct logit attribution: the parts sum to the logit; post-norm is refused', function()
  local m, x = tiny(), ids(3, 6, 21)
  local r = probe.logit_attribution(m, x, 4)
  eq(#r.rows, 1 + 2 * (4 + 1) + 2 + 1)
  eq(r.rows[1][1], 'embed')
  eq(r.rows[2][1], 'blocks.1.attn head 1')
  eq(r.rows[#r.rows][1], 'bias')
  local logits = torch.no_grad(function() return m(x) end)
  local want = logits:select(2, 6):select(2, 4):mean():item()
  assert(math.abs(r.logit - want) < 1e-5, ('r.logit vs want: difference %.3g, tolerance 1e-5'):format(math.abs(r.logit - want)))
  assert(math.abs(r.total - r.logit) < 1e-4, ('parts sum to %g, logit %g'):format(r.total, r.logit))
  local d = probe.logit_attribution(m, x, {4, 7}, {position = 3})
  assert(math.abs(d.total - d.logit) < 1e-4, ('d.total vs d.logit: difference %.3g, tolerance 1e-4'):format(math.abs(d.total - d.logit)))
  assert(tostring(d):find('logit[4] - logit[7]', 1, true))
  raises(function() probe.logit_attribution(tiny('post'), x, 4) end,
    "direct logit attribution needs pre-norm residual blocks (models.gpt is post-norm unless built with norm = 'pre')")
  -- drawn with its sign: a negative part is a red bar below the zero line
  local svg = r:svg()
  local neg
  for _, row in ipairs(r.rows) do if row[2] < 0 then neg = row[1] end end
  if neg then assert(svg:find('fill="#d62728"><title>' .. neg:gsub('%p', '%%%0') .. ':'), 'a negative bar for ' .. neg) end
  -- and added to an autopsy's report
  local a = autopsy.run(m, {x, x}, {steps = 1})
  a:add(r)
  local path = os.tmpname()
  a:report(path)
  local html = io.open(path):read('*a')
  os.remove(path)
  assert(html:find('Patching and attribution', 1, true) and html:find('Direct logit attribution: logit[4]', 1, true))
  raises(function() a:add(42) end, 'a:add: expected a result with an svg() method (patching.run, probe.logit_attribution), got number')
end)

test("the autopsy keeps every head's map with its tokens: a:attention in the terminal, per-head maps in the report", function()
  torch.manual_seed(0)
  local corpus = data.from_string(('hello world, the quick brown fox. '):rep(40), {tokenizer = 'char'})
  local m = models.gpt{vocab = corpus.vocab_size, dim = 16, heads = 2, layers = 2, seq = 12, ffn = 32, norm = 'pre'}
  local a = autopsy.run(m, corpus, {steps = 1, batch = 2, seq = 12, probe_text = 'the quick fox'})
  local text = tostring(a:attention(2, 2, {numbers = true}))
  local shown = require('anatomy.session.kernel').mimebundle(a:attention(2, 2))
  assert(shown['image/svg+xml']:find('blocks.2 head 2', 1, true) and shown['text/html']:find('anatomy-output', 1, true),
    'in a notebook: the map as SVG and HTML')
  local lines = {}
  for l in text:gmatch('[^\n]+') do lines[#lines + 1] = l end
  eq(#lines, 2 + 12, 'title, column numbers, one row per query token')
  assert(lines[3]:find('^  1 t +1%.00'), lines[3])  -- the first query sees only itself
  assert(lines[6]:find('^  4 ␣'), 'a leading space shows as ␣: ' .. lines[6])
  raises(function() a:attention(2, 3) end, 'a:attention: head must be in 1..2, got 3')
  local path = os.tmpname()
  a:report(path)
  local html = io.open(path):read('*a')
  os.remove(path)
  assert(html:find('<h2>Attention maps</h2><p class="prompt">the probe text <code>the quick fox</code>', 1, true), 'the section names the whole text')
  local maps = 0
  for _ in html:gmatch('<figcaption>blocks%.%d head %d</figcaption>') do maps = maps + 1 end
  eq(maps, 4, 'two layers x two heads')
  assert(html:find('<title>q -&gt; t: ', 1, true), 'each cell says query -> key: weight')
end)

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
          local shown = tostring(h)
          H.eq(shown:match('^probe handle: .* at ') ~= nil and not shown:find('table: 0x', 1, true), true,
            kind .. ' on ' .. pt[1] .. ' prints what it attached: ' .. shown)
          probe.clear(m)
          H.eq(tostring(h), 'probe handle: nothing attached (removed, or cleared by probe.clear)', kind .. ' on ' .. pt[1] .. ', cleared')
          local after, after_mix = run()
          H.identical(after, clean, kind .. ' on ' .. pt[1] .. ', after probe.clear')
          H.identical(after_mix, clean_mix, kind .. ' on ' .. pt[1] .. ' (the Lua block), after probe.clear')
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
  H.raises_part(function() patching.run(m, clean, corrupt, function() error('metric failed') end) end, 'metric failed')
  H.identical(torch.no_grad(function() return m(clean) end), before, 'after patching')
  for n, mod in m:named_modules() do eq(rawget(mod, '_hook_entries'), nil, n) eq(rawget(mod, '_probes'), nil, n) end
end)

test('head, position and kind are checked when the intervention is attached', function()
  local m = models.gpt{vocab = 10, dim = 16, heads = 4, layers = 1, seq = 8, ffn = 32}
  H.raises_part(function() probe.ablate(m, 'blocks.1.attn.z', {head = 5}) end,
    'probe.ablate: head must be an integer in 1..4 for blocks.1.attn.z (blocks.1.attn has 4 heads), got 5')
  H.raises_part(function() probe.set(m, 'blocks.1.attn.pattern', 0, {head = 5}) end, 'head must be an integer in 1..4')
  H.raises_part(function() probe.patch(m, 'blocks.1.attn.q', torch.zeros(1, 8, 4, 4), {head = 9}) end, 'head must be an integer in 1..4')
  H.raises_part(function() probe.ablate(m, 'blocks.1.mlp', {position = 9}) end,
    'probe.ablate: position must be an integer in 1..8 (or -8..-1) for blocks.1.mlp (the model takes at most 8 positions), got 9')
  H.raises_part(function() probe.ablate(m, 'blocks.1.attn.z', {position = -9}) end, 'position must be an integer in 1..8')
  H.raises_part(function() probe.ablate(m, 'blocks.1.attn.z', {kind = 'average'}) end,
    "probe.ablate: kind must be 'zero', 'mean' or 'resample', got 'average'")
  H.raises_part(function() probe.ablate(m, 'blocks.1.attn.z', {head = 1.5}) end, 'head must be a positive integer, got 1.5')
  -- nothing was attached by the refused calls
  for n, mod in m:named_modules() do eq(rawget(mod, '_hook_entries'), nil, n) eq(rawget(mod, '_probes'), nil, n) end
  -- a VibeNet's attention has one head; grouped keys have kv_heads
  local v = models.vibenet{vocab = 10, dim = 8, layers = 1, seq = 8}
  H.raises_part(function() probe.ablate(v, 'blocks.1.inner.attn.pattern', {head = 2}) end, 'head must be an integer in 1..1')
  local a = nn.RoPEAttention(16, 4, {kv_heads = 2})
  eq({a:num_heads('q'), a:num_heads('k'), a:num_heads('z')}, {4, 2, 4})
end)

test('a mean ablation over one example is refused: it would change nothing', function()
  local m = model()
  H.raises_part(function() probe.ablate(m, 'blocks.1.attn.z', {kind = 'mean', over = torch.randint(1, 11, {1, 8})}) end,
    "probe.ablate: kind = 'mean' over a reference batch of one example would put that example's own activation back")
  local _, one = probe.run_with_cache(m, torch.randint(1, 11, {1, 8}))
  H.raises_part(function() probe.ablate(m, 'blocks.1.mlp', {kind = 'mean', over = one}) end, 'the mean of one example is the example')
end)

test("a checkpoint's names work in caches, over =, patching and layer arguments", function()
  local dir = H.gpt2_folder()
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
  H.identical(a, b, 'the mean ablation named either way')
  eq(cache:heads('pattern', 'transformer.h.1'):size(), cache:heads('pattern', 'h.2'):size())
  local p = probe.patch(m, 'transformer.h.1.mlp', cache)
  p:remove()
  -- the attribution holds each norm's scale while it reads out, and lets go after
  local before = torch.no_grad(function() return m(ids) end)
  probe.logit_attribution(m, ids, 3)
  H.identical(torch.no_grad(function() return m(ids) end), before, 'after the attribution')
  for n, mod in m:named_modules() do eq(rawget(mod, '_hook_entries'), nil, n) eq(rawget(mod, '_probes'), nil, n) end
  -- the autopsy's layer arguments
  local a = autopsy.run(m, {ids, torch.randint(1, 12, {4, 6})})
  eq(a.rows[2].hf_name, 'transformer.h.0')
  eq(tostring(a:attention('transformer.h.0', 1)), tostring(a:attention('h.1', 1)))
  H.raises_part(function() a:attention('h.0', 1) end, "write 'h.1', or the checkpoint's own name 'transformer.h.0'")
  os.execute("rm -rf '" .. dir .. "'")
end)

test("h.0 is no anatomy name: an error with both spellings, never the first layer twice", function()
  local dir = H.gpt2_folder()
  local m = models.from_pretrained(dir)
  local msg = "'h.0.attn': anatomy counts layers from 1, so a layer 0 is no anatomy name: write 'h.1.attn', "
    .. "or the checkpoint's own name 'transformer.h.0.attn'"
  H.raises_part(function() probe.resolve_name(m, 'h.0.attn') end, msg)
  H.raises_part(function() probe.ablate(m, 'h.0.attn.z', {head = 1}) end, "write 'h.1.attn.z', or the checkpoint's own name 'transformer.h.0.attn.z'")
  H.raises_part(function() probe.skip(m, 'h.0') end, "write 'h.1', or the checkpoint's own name 'transformer.h.0'")
  local _, cache = probe.run_with_cache(m, torch.randint(1, 12, {1, 4}))
  H.raises_part(function() return cache['h.0.mlp'] end, "write 'h.1.mlp'")
  eq(probe.resolve_name(m, 'h.1'), 'h.1')
  eq(probe.resolve_name(m, 'transformer.h.0'), 'h.1')
  eq(probe.resolve_name(m, 'transformer.h.1'), 'h.2')
  os.execute("rm -rf '" .. dir .. "'")
end)

-- A hook that runs the model again from inside its forward: the recursion
-- goes through the C++ blocks; it must end in an error (once, not a 44 KB
-- message with the place repeated a level at a time), and the model must
-- work once the hook is gone.
test('a hook that calls its own model ends in one stack overflow error, and the model goes on', function()
  local m = models.gpt{vocab = 7, dim = 8, heads = 2, layers = 1, seq = 4, ffn = 8}
  local x = torch.tensor({{1, 2, 3}}, {dtype = 'int64'})
  local calls = 0
  local h = probe.replace(m, 'blocks.1.attn.q', function(t) calls = calls + 1; m(x); return t end)
  raises(function() return m(x) end,
    'in block 1 (models.GPTBlock) of nn.Repeat: stack overflow (the model was called again from inside its own forward, by the block or by a hook on it)')
  -- stopped by the library's own bound on nested children, well before
  -- LuaJIT's stack overflow (744 levels here, whose unwinding has crashed)
  eq(calls > 10 and calls <= 200, true, 'the recursion is stopped at a bounded depth: ' .. calls .. ' calls')
  h:remove()
  local once = false
  h = probe.replace(m, 'blocks.1', function(t) if not once then once = true; m(x) end; return t end)
  eq(m(x):size(3), 7, 'a re-entrant call that ends is fine')
  h:remove()
  eq(m(x):size(3), 7)
end)

-- The bound on nested children counts per coroutine: one abandoned while
-- suspended inside a forward (a generator stopped early) once left its count
-- on the global counter, and 200 of them made every later forward fail.
test('coroutines abandoned inside a forward leave the nesting bound as it was', function()
  local Pause = nn.block('test.Pause', function() end)
  function Pause:forward(x) coroutine.yield(); return x end
  local m = nn.Sequential{nn.Sequential{Pause()}}
  local x = torch.ones(1, 2)
  for _ = 1, 250 do
    local co = coroutine.create(function() return m(x) end)
    assert(coroutine.resume(co))
    eq(coroutine.status(co), 'suspended')
  end
  collectgarbage()
  local co = coroutine.create(function() return m(x) end)
  assert(coroutine.resume(co))
  local ok, y = coroutine.resume(co)
  eq(ok, true, tostring(y))
  eq(y:size(2), 2, 'a forward after 250 abandoned ones runs')
  eq(nn.Sequential{nn.Linear(2, 2)}(x):size(2), 2, 'and one on the main thread')
end)

test("TransformerLens's hook names, layers from 0, name the same points on a built-in GPT; a name with no counterpart says so", function()
  torch.manual_seed(0)
  local m = models.gpt{vocab = 10, dim = 8, heads = 2, layers = 2, seq = 8, ffn = 16, norm = 'pre'}
  local expect = {['blocks.0.attn.hook_z'] = 'blocks.1.attn.z', ['blocks.1.hook_resid_pre'] = 'blocks.2.resid_pre',
    ['blocks.0.hook_resid_mid'] = 'blocks.1.resid_mid', ['blocks.1.attn.hook_attn_scores'] = 'blocks.2.attn.scores',
    ['blocks.0.ln1.hook_scale'] = 'blocks.1.ln1.scale', ['blocks.1.ln2.hook_normalized'] = 'blocks.2.ln2.normalized',
    ['blocks.0.mlp.hook_pre'] = 'blocks.1.mlp.pre', ['blocks.1.hook_mlp_out'] = 'blocks.2.mlp',
    ['blocks.0.hook_attn_out'] = 'blocks.1.attn', ['blocks.1.hook_out'] = 'blocks.2'}
  for tl, anatomy in pairs(expect) do eq(probe.canonical(m, tl), anatomy, tl) end
  local _, cache = probe.run_with_cache(m, torch.tensor({{1, 2, 3}}):long())
  for tl, anatomy in pairs(expect) do assert(cache[tl] ~= nil and rawequal(cache[tl], cache[anatomy]), 'cache[' .. tl .. '] is cache[' .. anatomy .. ']') end
  -- interventions take them too: zeroing head 1 through either name gives one output
  local ids = torch.tensor({{1, 2, 3}}):long()
  local h = probe.ablate(m, 'blocks.0.attn.hook_z', {head = 1})
  local a = torch.no_grad(function() return m(ids) end)
  h:remove()
  h = probe.ablate(m, 'blocks.1.attn.z', {head = 1})
  H.identical(a, torch.no_grad(function() return m(ids) end), 'ablation by either name')
  h:remove()
  raises(function() probe.canonical(m, 'blocks.2.hook_resid_post') end,
    "'blocks.2.hook_resid_post' (a TransformerLens name): TransformerLens counts layers from 0, so blocks.2 is layer 3, and the model has 2")
  raises(function() probe.ablate(m, 'blocks.0.attn.hook_qkv', {head = 1}) end,
    "'blocks.0.attn.hook_qkv' (a TransformerLens name): anatomy has no counterpart of it (docs/pretrained.md lists the names it maps); "
    .. "did you mean 'blocks.0.attn.hook_q'?")
  raises(function() probe.canonical(m, 'hook_pos_embed') end,
    "'hook_pos_embed' (a TransformerLens name): the model has no positional embedding child (its positions are rotary, or inside another block)")
end)

test("the cache's TransformerLens methods: the decomposition sums to the stream, the labels count from 1, bad layers are named", function()
  torch.manual_seed(0)
  local m = models.gpt{vocab = 10, dim = 8, heads = 2, layers = 2, seq = 8, ffn = 16, norm = 'pre'}
  local ids = torch.tensor({{1, 2, 3, 4}, {5, 6, 7, 8}}):long()
  local _, cache = probe.run_with_cache(m, ids, {filter = {'*', '*.result'}})
  local acc, labels = cache:accumulated_resid()
  eq(labels, {'1_pre', '2_pre', 'final_post'}, 'accumulated labels')
  H.identical(acc[3], cache['blocks.2.resid_post'], 'final_post is the last resid_post')
  -- the built-in GPT adds its positions inside 'embed': the decomposition is that, then each layer's outputs
  local parts, names = cache:decompose_resid()
  eq(names, {'embed', '1_attn_out', '1_mlp_out', '2_attn_out', '2_mlp_out'}, 'decomposition labels')
  H.close(parts:sum(1), cache['blocks.2.resid_post'], 1e-5, 'the parts sum to the stream')
  local heads, hl = cache:stack_head_results({layer = 2})
  eq(hl, {'L1H1', 'L1H2'}, 'the heads before layer 2')
  local bias
  for name, p in m:named_parameters() do if name == 'blocks.1.attn.proj.bias' then bias = p end end
  H.close(heads:sum(1) + bias, cache['blocks.1.attn'], 1e-5, "the heads sum to the attention's output, with its bias")
  raises(function() cache:accumulated_resid({layer = 4}) end,
    "cache:accumulated_resid: layer must be in 1..3 (the input of that layer; 3 or nil: the final norm's), got 4")
  raises(function() cache:apply_ln_to_stack(acc, {layer = 1, recompute = true}) end,
    'cache:apply_ln_to_stack: recompute applies the final norm; give no layer (or 3)')
  local _, bare = probe.run_with_cache(m, ids)
  raises(function() bare:stack_head_results() end,
    "cache:stack_head_results: the cache has no 'blocks.1.attn.result' (blocks.0.attn.hook_result): run probe.run_with_cache without a filter, or with it in the filter")
end)

test("TransformerLens names and globs work in every filter and cache key of a model built in Lua; a miss names the closest", function()
  local m, x = tiny(), ids(1, 6)
  local _, c = probe.run_with_cache(m, x, {filter = {'blocks.0.hook_resid_post', 'blocks.*.attn.hook_pattern'}})
  eq(c:names(), {'blocks.1.attn.pattern', 'blocks.1.resid_post', 'blocks.2.attn.pattern'})
  close(c['blocks.0.hook_resid_post'], c['blocks.1.resid_post'], 0, 'a TransformerLens key reads the same tensor')
  close(c['blocks.1.attn.hook_pattern'], c['blocks.2.attn.pattern'], 0, "TransformerLens's layer 1 is anatomy's 2")
  local tl = probe.transformer_lens_names(m)
  eq(tl[1], {'hook_embed', 'embed'})
  eq(tl[#tl], {'ln_final.hook_normalized', 'ln_f.normalized'})
  -- a typo, a 0-based anatomy name, a TransformerLens glob that matches nothing: errors, never an empty cache
  H.raises_part(function() probe.run_with_cache(m, x, {filter = {'blocks.1.attn.patern'}}) end,
    "probe.run_with_cache: the filter entry 'blocks.1.attn.patern' matches no probe point of models.GPT; did you mean 'blocks.1.attn.pattern'?")
  H.raises_part(function() probe.run_with_cache(m, x, {filter = 'blocks.0.resid_post'}) end,
    "anatomy counts layers from 1: write 'blocks.1.resid_post', or TransformerLens's 'blocks.0.hook_resid_post'")
  H.raises_part(function() probe.run_with_cache(m, x, {filter = 'blocks.*.hook_resid_pots'}) end,
    "the filter entry 'blocks.*.hook_resid_pots' matches no probe point")
  H.raises_part(function() probe.run_with_cache(m, x, {filter = 'blocks.*.resid_pots'}) end,
    "the filter entry 'blocks.*.resid_pots' matches no probe point of models.GPT; did you mean 'blocks.1.resid_post'?")
  H.raises_part(function() probe.run_with_cache(m, x, {filter = 'blocks.2.hook_resid_post'}) end,
    'TransformerLens counts layers from 0, so blocks.2 is layer 3, and the model has 2')
  H.raises_part(function() probe.capture(m, {filter = 'blocks.1.resid_pots'}, function() m(x) end) end,
    "probe.capture: the filter entry 'blocks.1.resid_pots' matches no probe point")
  H.raises_part(function() return c['blocks.1.attn.patern'] end,
    "probe cache: the key 'blocks.1.attn.patern' matches no probe point of models.GPT; did you mean 'blocks.1.attn.pattern'?")
  H.raises_part(function() return c['blocks.0.resid_post'] end, "write 'blocks.1.resid_post'")
  eq(c:get('blocks.1.attn.z'), nil)
  H.raises_part(function() return c['blocks.0.attn.hook_patern'] end, "did you mean 'blocks.0.attn.hook_pattern'?")
  H.raises_part(function() probe.run_with_cache(m, x, {filter = 'blocks.0.hook_resid_pots'}) end,
    "'blocks.0.hook_resid_pots' (a TransformerLens name): anatomy has no counterpart of it (docs/pretrained.md lists the names it maps); "
    .. "did you mean 'blocks.0.hook_resid_post'?")
  H.raises_part(function() probe.replace(m, 'blocks.0.attn.z', function() end) end,
    "no module or hook point named 'blocks.0.attn.z' in models.GPT; anatomy counts layers from 1: write 'blocks.1.attn.z', "
    .. "or TransformerLens's 'blocks.0.attn.hook_z'")
end)

test("patching.run's over: a point within each layer in any spelling, the role names across families, one layer's name refused", function()
  local m, clean, corrupt = tiny(), ids(1, 6, 1), ids(1, 6, 2)
  local metric = patching.logit_diff(3, 4)
  local function points_of(model, over, a, b)
    return table.concat(patching.run(model, a or clean, b or corrupt, metric, {over = over}).points, ',')
  end
  eq(points_of(m, 'attn.hook_z'), 'blocks.1.attn.z,blocks.2.attn.z')
  eq(points_of(m, 'hook_resid_pre'), 'blocks.1.resid_pre,blocks.2.resid_pre')
  eq(points_of(m, 'hook_attn_out'), 'blocks.1.attn,blocks.2.attn')
  eq(points_of(m, 'attn'), 'blocks.1.attn,blocks.2.attn')
  local z = patching.run(m, clean, corrupt, metric, {over = 'attn.z'}).grid
  close(patching.run(m, clean, corrupt, metric, {over = 'attn.hook_z'}).grid, z, 0, 'attn.hook_z patches what attn.z does')
  H.raises_part(function() patching.run(m, clean, corrupt, metric, {over = 'blocks.0.attn.hook_z'}) end,
    "patching.run: over = 'blocks.0.attn.hook_z' names one layer's point; over is the point within each layer (here 'attn.hook_z'), "
    .. 'and layers = {1} keeps that layer alone')
  H.raises_part(function() patching.run(m, clean, corrupt, metric, {over = 'blocks.2.attn.z'}) end, 'layers = {2} keeps that layer alone')
  torch.manual_seed(0)
  local llama = models.llama{vocab = 13, dim = 16, heads = 4, kv_heads = 2, layers = 2, ffn = 32, seq = 8}
  eq(points_of(llama, 'attn'), 'blocks.1.self_attn,blocks.2.self_attn')
  eq(points_of(llama, 'attn.hook_z'), 'blocks.1.self_attn.z,blocks.2.self_attn.z')
  eq(points_of(llama, 'mlp.hook_post'), 'blocks.1.mlp.post,blocks.2.mlp.post')
end)

test('a forgotten ablation is refused by the analyses, shown by print(model) and probe.list; probe.with and run_with_hooks remove what they attach', function()
  local m, clean, corrupt = tiny(), ids(2, 6, 1), ids(2, 6, 2)
  local metric = patching.logit_diff(3, 4)
  local base = patching.run(m, clean, corrupt, metric)
  local h = probe.ablate(m, 'blocks.1.attn.z', {head = 2})
  eq(#probe.list(m), 1)
  eq(probe.list(m)[1].kind, 'replace')
  eq(probe.list(m)[1].at, 'blocks.1.attn.z')
  local shown = tostring(m)
  assert(shown:find('attached: replace at blocks.1.attn.z (probe.list(model); probe.clear(model) removes everything)', 1, true), shown)
  local refusal = "the model has replace at blocks.1.attn.z attached, so this would measure the changed model"
  H.raises_part(function() patching.run(m, clean, corrupt, metric) end, 'patching.run: ' .. refusal)
  H.raises_part(function() probe.detect_heads(m, clean, 'previous_token') end, 'probe.detect_heads: ' .. refusal)
  H.raises_part(function() autopsy.run(m, {clean, corrupt}) end, 'autopsy.run: ' .. refusal)
  H.raises_part(function() train.evaluate(m, data.from_string(('abcdefghijklm'):rep(20)), {seq = 6, batches = 1}) end,
    'train.evaluate: ' .. refusal)
  H.raises_part(function() patching.run(m, clean, corrupt, metric) end, 'or run this inside probe.with(handles, fn) to mean it')
  -- meant: inside probe.with, the analysis runs on the ablated model, and the ablation is gone afterwards
  local ablated = probe.with(h, function() return patching.run(m, clean, corrupt, metric) end)
  eq(#probe.list(m), 0, 'probe.with removed the ablation')
  assert(not tostring(m):find('attached', 1, true), 'print(model) shows nothing attached')
  assert(math.abs(ablated.clean - base.clean) > 1e-6, 'the ablation changed the clean metric inside probe.with')
  close(patching.run(m, clean, corrupt, metric).grid, base.grid, 0, 'and patching after it is the clean model again')
  -- removed on error too
  local h2 = probe.skip(m, 'blocks.2')
  local ok, err = pcall(probe.with, {h2}, function() error('inside') end)
  assert(not ok and tostring(err):find('inside', 1, true), tostring(err))
  eq(#probe.list(m), 0, 'probe.with removed the skip after the error')
  raises(function() probe.with({'x'}, function() end) end, 'probe.with: handles[1] is a string, not a handle (probe.replace, probe.ablate, ... return one)')
  -- bad arguments to the checks themselves: errors, not a loop from -inf (the Lua API fuzzer's find)
  raises(function() probe.require_clean(m, 'x', -math.huge) end, 'probe.require_clean: level must be a whole number in 1..50, got -inf')
  raises(function() probe.require_clean(print, print) end, 'probe.require_clean: model must be a model, got function')
  raises(function() probe.analysis(3) end, 'probe.analysis: fn must be a function, got number')
  raises(function() probe.list(5) end, 'probe.list: model must be a model, got number')
  -- run_with_hooks: TransformerLens's names and globs, one forward, nothing left behind
  local plain = torch.no_grad(function() return m(clean) end)
  local seen = {}
  local out = probe.run_with_hooks(m, clean, {{'blocks.*.hook_resid_post', function(t, name) seen[#seen + 1] = name end},
    {'blocks.0.attn.hook_z', function(z) return z * 0 end}})
  eq(seen, {'blocks.1.resid_post', 'blocks.2.resid_post'})
  local zeroed = probe.with(probe.replace(m, 'blocks.1.attn.z', function(z) return z * 0 end), function() return m(clean) end)
  close(out, zeroed, 0, "run_with_hooks = the same replacement attached by hand")
  assert((out - plain):abs():max():item() > 1e-4, 'the hook changed the output')
  eq(#probe.list(m), 0, 'run_with_hooks removed its hooks')
  H.raises_part(function() probe.run_with_hooks(m, clean, {{'blocks.1.attn.patern', function() end}}) end,
    "probe.run_with_hooks: the name 'blocks.1.attn.patern' matches no probe point of models.GPT; did you mean 'blocks.1.attn.pattern'?")
  H.raises_part(function() probe.run_with_hooks(m, clean, {{'blocks.1.attn.z', function() error('in the hook') end}}) end, 'in the hook')
  eq(#probe.list(m), 0, 'run_with_hooks removed its hooks after the error')
  h:remove()
end)

test('patching output cannot mislead: the effect and the shares with clean and corrupt stated, and a grid within the noise says so', function()
  local m = tiny()
  local a, b = ids(1, 6, 1), ids(1, 6, 2)
  local metric = patching.logit_diff(3, 4)
  local r = patching.run(m, torch.cat({a, b}, 1), torch.cat({b, a}, 1), metric, {over = 'attn.z', per = 'head'})
  -- swapped pairs: clean - corrupt is d and -d, mean 0, its standard error |d|
  assert(math.abs(r.difference) < 1e-6, 'clean - corrupt of swapped pairs: ' .. r.difference)
  eq(r.examples, 2)
  eq(r.meaningful, false)
  H.raises_part(function() r:normalized() end, 'patching: no normalized result: ')
  H.raises_part(function() r:normalized() end, 'read result.effect (patched - corrupt) instead')
  local text = tostring(r)
  assert(text:find('NOT MEANINGFUL: ', 1, true), text)
  assert(text:find('effect: patched - corrupt (not normalized)', 1, true), text)
  close(r.effect, r.grid - r.corrupt, 0, 'the effect')
  -- a real difference: shares, with clean, corrupt and the spread printed
  local good = patching.run(m, a, b, metric, {over = 'attn.z', per = 'head'})
  local shown = tostring(good)
  assert(shown:find(('clean %.6g, corrupt %.6g: clean - corrupt = %.4g (one example: no spread to judge the noise by)'):format(
    good.clean, good.corrupt, good.difference), 1, true), shown)
  assert(shown:find('share of clean - corrupt restored', 1, true), shown)
  close(good:normalized(), good.effect / (good.clean - good.corrupt), 0, 'normalized = effect / (clean - corrupt)')
  -- the page's table shows the printed numbers
  local page = H.read(good:report(os.tmpname() .. '.html'))
  local first = good:normalized()[1][1]:item()
  assert(page:find(('<td>%.4f</td>'):format(first), 1, true), 'the table holds the shares print shows')
  -- the same clean and corrupt: nothing to normalise by
  local same = patching.run(m, a, a, metric)
  eq(same.meaningful, false)
  H.raises_part(function() same:normalized() end, 'clean and corrupt give the same metric')
end)

test("per = 'head_position': one head at one position a run, TransformerLens's (layer, position, head) grid", function()
  local m, clean, corrupt = tiny(), ids(1, 5, 1), ids(1, 5, 2)
  local metric = patching.logit_diff(3, 4)
  local r = patching.run(m, clean, corrupt, metric, {over = 'attn.hook_z', per = 'head_position'})
  eq(r.grid:size(), {8, 5}, 'a row a (layer, head), a column a position')
  eq(r.rows[6], 'blocks.2 head 2')
  eq(r.layer_position_head:size(), {2, 5, 4})
  local cache = select(2, probe.run_with_cache(m, clean, {filter = 'blocks.2.attn.z'}))
  local h = probe.patch(m, 'blocks.2.attn.z', cache, {head = 2, position = 4})
  local want = probe.with(h, function() return metric(torch.no_grad(function() return m(corrupt) end)):item() end)
  close(r.layer_position_head[2][4][2], want, 1e-6, 'layer 2, position 4, head 2 patched alone')
  close(r.grid[6][4], want, 1e-6, 'the same cell in the printed grid')
  -- the heads at each position add up to the whole position only where the metric is linear; here each cell is its own run
  H.raises_part(function() patching.run(m, clean, corrupt, metric, {over = 'resid_pre', per = 'head_position'}) end,
    "patching.run: per = 'head_position' needs a point with heads")
end)

H.done()
