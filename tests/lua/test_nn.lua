-- The module protocol, built-in blocks, wrappers and models, checked through
-- behaviour: names, values, gradients, errors and saved files.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, close, raises = H.test, H.eq, H.close, H.raises

local function names(m)
  local out = {}
  for n in m:named_parameters() do out[#out + 1] = n end
  return out
end

test('named_parameters: dotted names in definition order, 1-based indices', function()
  local m = nn.Sequential{nn.Linear(3, 4), nn.ReLU(), nn.Residual(nn.Linear(4, 4, {bias = false}))}
  eq(names(m), {'1.weight', '1.bias', '3.inner.weight'})
  eq(#m:parameters(), 3)
  eq(m:num_parameters(), 3 * 4 + 4 + 16)
  eq(#m:children(), 3)
  eq(#m, 3)
  local mods = {}
  for n, c in m:named_modules() do mods[#mods + 1] = n .. '=' .. nn.typename(c) end
  eq(mods, {'=nn.Sequential', '1=nn.Linear', '2=nn.ReLU', '3=nn.Residual', '3.inner=nn.Linear'})
  eq(m[1].weight:size(), {4, 3}, 'a Linear weight is [out, in]')
end)

test('Lua blocks register fields and parameters in definition order', function()
  local B = nn.block('TestBlock', function(self, d)
    self.scale = nn.Parameter(torch.ones(d))
    self.fc = nn.Linear(d, d)
    self.note = 'not a module'
    self.bias = nn.Parameter(torch.zeros(d))
  end)
  function B:forward(x) return self.fc(x) * self.scale + self.bias end
  local b = B(2)
  eq(names(b), {'scale', 'bias', 'fc.weight', 'fc.bias'})
  eq(b.note, 'not a module')
  local y = b(torch.ones(1, 2))
  eq(y:size(), {1, 2})
  y:sum():backward()
  assert(b.scale.grad ~= nil and b.fc.weight.grad ~= nil, 'gradients reach Lua and native parameters')
  b:zero_grad()
  eq(b.scale.grad, nil)
end)

test('train and eval reach every module, native ones included', function()
  local m = nn.Sequential{nn.Dropout(0.5), nn.Linear(4, 4)}
  m:eval()
  eq(m[1].training, false)
  local x = torch.ones(1000, 4)
  close(m[1](x), x, 0, 'dropout is the identity in eval mode')
  m:train()
  local y = m[1](x)
  local zeros = y:eq(0):double():mean():item()
  assert(zeros > 0.4 and zeros < 0.6, 'about half dropped in training mode: ' .. zeros)
  close(y:max(), 2, 1e-6, 'survivors scaled by 1/(1-p)')
end)

test('state_dict round trip and load_state_dict errors list every problem', function()
  torch.manual_seed(1)
  local a = nn.Sequential{nn.Linear(3, 4), nn.LayerNorm(4)}
  local b = nn.Sequential{nn.Linear(3, 4), nn.LayerNorm(4)}
  b:load_state_dict(a:state_dict())
  close(b[1].weight, a[1].weight, 0)
  local x = torch.randn(2, 3)
  close(b(x), a(x), 0)
  local sd = a:state_dict()
  sd['1.bias'] = nil
  sd['2.weight'] = torch.ones(5)
  sd['extra'] = torch.ones(1)
  raises(function() b:load_state_dict(sd) end,
    'load_state_dict of nn.Sequential failed (wrong shape: 2.weight (5 in the state dict, 4 in the model); missing: 1.bias; unexpected: extra)')
  sd['2.weight'] = torch.ones(4)
  b:load_state_dict(sd, {strict = false})
  close(b[2].weight, torch.ones(4), 0)
end)

test('save and load through safetensors', function()
  local path = os.tmpname()
  local a = models.gpt{vocab = 11, dim = 8, heads = 2, layers = 2, seq = 6, ffn = 16}
  a:save(path)
  local sd, meta, order = torch.load_safetensors(path)
  eq(meta.class, 'models.GPT')
  eq(#order, #names(a))
  local b = models.gpt{vocab = 11, dim = 8, heads = 2, layers = 2, seq = 6, ffn = 16}
  b:load(path)
  local ids = torch.tensor({{1, 5, 11, 2}}, {dtype = 'int64'})
  close(b(ids), a(ids), 0)
  os.remove(path)
end)

test('to(dtype) converts parameters in place, keeping their identity', function()
  local P = nn.block('P', function(self) self.p = nn.Parameter(torch.ones(2)) end)
  function P:forward(x) return x * self.p end
  local m = nn.Sequential{nn.Linear(2, 2), P()}
  local w, p = m[1].weight, m[2].p
  m:to('float64')
  eq(w.dtype, 'float64')
  eq(p.dtype, 'float64')
  eq(m[1].weight == w, true)
  eq(m(torch.ones(1, 2, {dtype = 'float64'})).dtype, 'float64')
  eq(p.requires_grad, true)
end)

test('tostring prints the tree with shapes and counts', function()
  local m = models.vibenet{vocab = 65, dim = 64, layers = 4, seq = 64}
  local s = tostring(m)
  assert(s:find('models.VibeNet(vocab=65, dim=64, layers=4, seq=64, block=plain) {  -- 33,537 params', 1, true), s)
  assert(s:find('(1-4): 4 x nn.Residual {', 1, true), s)
  assert(s:find('(head): nn.Linear(192 -> 65, bias=true)  -- 12,545 params: weight 65x192, bias 65', 1, true), s)
end)

test('built-in blocks compute what they document', function()
  torch.manual_seed(2)
  local x = torch.randn(2, 5, 8)
  local lin = nn.Linear(8, 3)
  close(lin(x), x:matmul(lin.weight:t()) + lin.bias, 1e-6)
  local rms = nn.RMSNorm(8)
  close(rms(x), x / ((x * x):mean(-1, true) + 1e-6):sqrt(), 1e-5)
  local ln = nn.LayerNorm(8)
  local centred = x - x:mean(-1, true)
  close(ln(x), centred / ((centred * centred):mean(-1, true) + 1e-5):sqrt(), 1e-5)
  local vibe = nn.VibeAttention()
  local att = (x:matmul(x:transpose(2, 3)) / math.sqrt(8)):masked_fill(torch.ones(5, 5):triu(1):bool(), -math.huge):softmax(-1)
  close(vibe(x), att:matmul(x), 1e-5)
  local emb = nn.Embedding(10, 4, {positions = 6})
  local ids = torch.tensor({{1, 10, 3}}, {dtype = 'int64'})
  close(emb(ids)[1][2], emb.weight[10] + emb.pos_weight[2], 1e-6)
  local mlp = nn.MLP(8, 16, {activation = 'relu'})
  eq(names(mlp), {'fc.weight', 'fc.bias', 'proj.weight', 'proj.bias'})
end)

test('VibeAttention\'s own backward equals autograd of the composed ops', function()
  torch.manual_seed(5)
  for _, causal in ipairs{true, false} do
    local x = torch.randn(3, 6, 4, {dtype = 'float64', requires_grad = true})
    local w = torch.randn(3, 6, 4, {dtype = 'float64'})
    local vibe = nn.VibeAttention{causal = causal}
    local y = vibe(x)
    y:mul(w):sum():backward()
    local fused = x.grad:clone()
    local x2 = x:detach():clone():requires_grad_()
    local s = x2:matmul(x2:transpose(2, 3)) / 2
    if causal then s = s:masked_fill(torch.ones(6, 6):triu(1):bool(), -math.huge) end
    local y2 = s:softmax(-1):matmul(x2)
    y2:mul(w):sum():backward()
    close(y, y2, 1e-14, 'forward, causal=' .. tostring(causal))
    close(fused, x2.grad, 1e-12, 'gradient, causal=' .. tostring(causal))
  end
  -- a probe that wants gradients through the pattern gets the composed ops, with the same result
  local x = torch.randn(2, 5, 4, {dtype = 'float64', requires_grad = true})
  local v = nn.VibeAttention()
  v(x):sum():backward()
  local g = x.grad:clone()
  x.grad = nil
  v:keep_pattern(true, true)
  v(x):sum():backward()
  close(x.grad, g, 1e-12, 'composed path')
  eq(v:pattern().requires_grad, true)
end)

test('attention publishes its pattern when asked', function()
  local a = nn.Attention(8, 2)
  eq(names(a), {'qkv.weight', 'qkv.bias', 'proj.weight', 'proj.bias'})
  eq(a:pattern(), nil)
  a:keep_pattern(true)
  a(torch.randn(3, 4, 8))
  local p = a:pattern()
  eq(p:size(), {3, 2, 4, 4})
  close(p:sum(-1), torch.ones(3, 2, 4), 1e-6, 'rows sum to 1')
  eq(p:triu(1):abs():sum():item(), 0, 'causal: nothing above the diagonal')
  local v = nn.VibeAttention()
  v:keep_pattern(true)
  v(torch.randn(1, 3, 4))
  eq(v:pattern():size(), {1, 1, 3, 3})
end)

test('bad inputs name the block and both shapes', function()
  local lin = nn.Linear(64, 8)
  raises(function() lin(torch.ones(2, 5, 32)) end,
    "bad argument #1 to 'forward' (Linear expects inputs whose last dimension is 64, got shape 2x5x32)")
  local seq = nn.Sequential{nn.Linear(4, 4), nn.Linear(5, 2)}
  raises(function() seq(torch.ones(1, 4)) end,
    "test_nn.lua:182: in block 2 (nn.Linear) of nn.Sequential: bad argument #1 to 'forward' (Linear expects inputs whose last dimension is 5, got shape 1x4)")
  local emb = nn.Embedding(10, 4)
  raises(function() emb(torch.tensor({{0, 3}}, {dtype = 'int64'})) end, '(token id 0 is out of range 1..10 (ids are 1-based))')
  raises(function() emb(torch.tensor({{1, 3}})) end, "(Embedding expects int64 token ids, got float32 (use {dtype = 'int64'} or x:long()))")
  raises(function() nn.Attention(10, 3) end, "bad argument #2 to 'nn.Attention' (dim 10 is not divisible by 3 heads)")
  raises(function() nn.Linear(3, 4, {biass = false}) end, "nn.Linear: unknown option 'biass', did you mean 'bias'? (expected bias)")
  raises(function() nn.Sequential{nn.Linear(2, 2), 'x'} end, 'nn.Sequential: entry 2 is string, not a module')
  raises(function() models.gpt{vocab = 5} end, 'models.gpt: config needs dim')
  raises(function() models.vibenet{vocab = 5, dim = 4, layers = 1, seq = 4, block = 'wide'} end,
    "models.vibenet: block must be 'plain', 'ffn', 'gate' or 'hyper', got 'wide'")
end)

test('a Lua-defined gate trains and matches nn.Gate on the same weights', function()
  local LuaGate = nn.block('LuaGate', function(self, inner, dim)
    self.gate = nn.Linear(dim, dim)
    self.inner = inner
  end)
  function LuaGate:forward(x) return self.gate(x) + self.inner(x) end

  torch.manual_seed(3)
  local builtin = nn.Sequential{nn.Gate(nn.Sequential{nn.Linear(6, 6), nn.GELU()}, 6), nn.Linear(6, 3)}
  local written = nn.Sequential{LuaGate(nn.Sequential{nn.Linear(6, 6), nn.GELU()}, 6), nn.Linear(6, 3)}
  eq(names(written), names(builtin))
  written:load_state_dict(builtin:state_dict())
  local x, target = torch.randn(32, 6), torch.randint(1, 4, {32})
  local losses = {}
  for _, m in ipairs{builtin, written} do
    local trace = {}
    for step = 1, 30 do
      m:zero_grad()
      local loss = nn.functional.cross_entropy(m(x), target)
      loss:backward()
      torch.no_grad(function() for _, p in ipairs(m:parameters()) do p:sub_(p.grad * 0.5) end end)
      trace[step] = loss:item()
    end
    losses[#losses + 1] = trace
  end
  assert(losses[1][30] < losses[1][1] * 0.8, ('it trains: %.4f -> %.4f'):format(losses[1][1], losses[1][30]))
  for step = 1, 30 do close(losses[2][step], losses[1][step], 1e-6, 'loss at step ' .. step) end
  close(written[1].gate.weight, builtin[1].gate.weight, 1e-6)
end)

test('mHC: Sinkhorn mixing is doubly stochastic and keeps deep stacks bounded', function()
  torch.manual_seed(4)
  local hc = nn.HyperConnections(nn.Linear(8, 8), 8, {streams = 4, constraint = 'sinkhorn'})
  local res, pre, post = hc:mixing()
  close(res:sum(2), torch.ones(4), 1e-5, 'rows sum to 1')
  close(res:sum(1), torch.ones(4), 1e-5, 'columns sum to 1')
  assert(res:min():item() >= 0, 'entries are non-negative')
  eq(pre:size(), {1, 4})
  local function growth(constraint)
    torch.manual_seed(5)
    local stack = nn.Sequential{nn.ExpandStreams(4),
      nn.Repeat(24, function() return nn.HyperConnections(nn.Sequential{nn.RMSNorm(16), nn.Linear(16, 16)}, 16,
        {streams = 4, constraint = constraint, init_std = 0.5}) end)}
    local x = torch.randn(2, 8, 16)
    local h = stack[1](x)
    local stds = {}
    torch.no_grad(function()
      for i = 1, 24 do
        h = stack[2][i](h)
        stds[i] = h:std():item()
      end
    end)
    return stds
  end
  local free, sink = growth('none'), growth('sinkhorn')
  print(('       activation std at layers 1, 8, 16, 24   none: %.3g %.3g %.3g %.3g   sinkhorn: %.3g %.3g %.3g %.3g')
    :format(free[1], free[8], free[16], free[24], sink[1], sink[8], sink[16], sink[24]))
  assert(free[24] / free[1] > 100, 'unconstrained mixing amplifies layer by layer')
  assert(sink[24] / sink[1] < 5, 'doubly-stochastic mixing does not')
  raises(function() hc(torch.randn(2, 3, 8)) end, 'nn.HyperConnections expects input of shape (..., 4, 8), got 2x3x8 (use nn.ExpandStreams(4) first)')
end)

test('vibenet blocks, funnel and stateful models run and shape their outputs', function()
  local ids = torch.randint(1, 21, {2, 8})
  for _, block in ipairs{'plain', 'ffn', 'gate', 'hyper'} do
    local m = models.vibenet{vocab = 20, dim = 16, layers = 2, seq = 8, block = block}
    eq(m(ids):size(), {2, 8, 20}, block)
  end
  local f = models.funnel{vocab = 20, seq = 8, widths = {32, 16, 8}, attentions = {1, 2, 3}}
  eq(f(ids):size(), {2, 8, 20})
  eq(names(f)[3], 'stages.1.blocks.1.inner.norm.weight')
  local s = models.stateful{vocab = 20, dim = 16, heads = 2, layers = 2, seq = 8, ffn = 32}
  local logits, h = s(ids)
  eq(logits:size(), {2, 8, 20})
  eq(h:size(), {2, 8, 16})
  local enriched = s(ids, h)
  assert((enriched - logits):abs():max():item() > 0, 'the previous pass changes the result')
  -- as an RNN: the state grows by one position per step
  local state
  local step_logits
  for t = 1, 3 do step_logits, state = s:step(ids:narrow(2, 1, t), state) end
  eq(step_logits:size(), {2, 20})
  eq(state.hidden:size(), {2, 3, 16})
end)

test('composition: named children in order, ModuleList and ModuleDict, and errors instead of silent drops', function()
  -- PyTorch's OrderedDict form: named children, in the given order
  local s = nn.Sequential{{'embed', nn.Linear(4, 3)}, {'act', nn.ReLU()}, {'head', nn.Linear(3, 2)}}
  local names = {}
  for name in s:named_children() do names[#names + 1] = name end
  eq(names, {'embed', 'act', 'head'})
  eq(s(torch.ones(1, 4)):size(), {1, 2})
  eq(s.head.weight:size(), {2, 3})
  -- a keyed table has no order: an error that says how to write it
  raises(function() nn.Sequential{embed = nn.Linear(2, 2), blocks = nn.Linear(2, 2)} end,
    "nn.Sequential: named entries (blocks, embed) have no order in a Lua table; give them in order as nn.Sequential{{'blocks', module}, ...}, or use a list")
  -- a plain table of modules in a field would lose its parameters: an error
  local Holder = nn.block('Holder', function(self) self.layers = {nn.Linear(2, 2), nn.Linear(2, 2)} end)
  raises(function() Holder() end, 'Holder.layers: a plain table of modules is not registered (its parameters would be missed); use nn.ModuleList{...} or nn.ModuleDict{...}')
  -- ModuleList and ModuleDict register their modules
  local Stack = nn.block('Stack', function(self)
    self.layers = nn.ModuleList{nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2)}
    self.heads = nn.ModuleDict{b = nn.Linear(2, 1), a = nn.Linear(2, 3)}
  end)
  function Stack:forward(x)
    for _, l in ipairs(self.layers:children()) do x = l(x) end
    return self.heads.a(x)
  end
  local m = Stack()
  eq(m:num_parameters(), 3 * 6 + 3 + 9, 'parameters of the list and the dict counted')
  local pnames = {}
  for name in m:named_parameters() do pnames[#pnames + 1] = name end
  eq(pnames[1], 'layers.1.weight')
  eq(pnames[#pnames], 'heads.b.bias', 'dict entries in sorted order')
  eq(m(torch.ones(1, 2)):size(), {1, 3})
  m.layers:append(nn.Linear(2, 2))
  eq(#m.layers, 4)
  raises(function() m.layers(torch.ones(1, 2)) end, 'in the forward of the block that holds it')
  -- a child that cannot run is an error when the container is built, not when it runs
  local NoForward = nn.block('NoForward', function() end)
  raises(function() nn.Sequential{nn.Linear(2, 2), NoForward()} end, 'nn.Sequential: entry 2 (NoForward) has no forward method: define NoForward:forward(x)')
  raises(function() nn.Residual(NoForward()) end, 'nn.Residual: inner (NoForward) has no forward method: define NoForward:forward(x)')
  raises(function() nn.Residual(nil) end, 'nn.Residual: inner is nil, not a module')
  raises(function() nn.Sequential{nn.ModuleList{}} end, 'nn.Sequential: entry 1 is an nn.ModuleList, which holds modules but does not run them: pass the modules themselves')
end)

test('sizes print as {2, 3}; a model\'s context comes from its position table', function()
  eq(tostring(torch.zeros(2, 3):size()), '{2, 3}')
  eq(tostring(torch.zeros(2, 3).shape), '{2, 3}')
  eq(torch.zeros(4):size()[1], 4)
  local m = nn.Sequential{nn.Embedding(10, 8, {positions = 32}), nn.Linear(8, 10)}
  eq(m:context(), 32, 'from the embedding positions')
  eq(models.gpt{vocab = 10, dim = 8, heads = 2, layers = 1, seq = 16, ffn = 16}:context(), 16, 'from config.seq')
  eq(nn.Sequential{nn.Linear(2, 2)}:context(), nil, 'unknown')
end)

test('help() reads the documentation from the library\'s own comments', function()
  local text = require('anatomy.session.help').text
  assert(text(train.fit):find('train.fit(model, corpus, opts) -> run', 1, true), text(train.fit))
  assert(text('nn.Linear'):find('a learned affine map', 1, true), text('nn.Linear'))
  assert(text('nn.Linear'):find('  named_parameters ', 1, true), 'a class lists its methods')
  assert(not text('nn.Linear'):find('  define ', 1, true), 'not the static helpers')
  assert(text(nn.Module):find('The model protocol', 1, true), 'help(nn.Module) states the protocol')
  assert(text(torch.Tensor.matmul):find("PyTorch's documentation", 1, true), text(torch.Tensor.matmul))
  assert(text():find('Globals, each with help(name)', 1, true))
  eq(text('no.such.thing'), "help: nothing is called 'no.such.thing' (help() lists where to start)")
  local m = models.gpt{vocab = 5, dim = 8, heads = 2, layers = 1, seq = 4, ffn = 8}
  assert(text(m):find('models.GPT', 1, true) and text(m):find('parameters', 1, true), 'a model: its class, tree and methods')
  eq(type(help), 'function', 'help is a global')
end)

test('an error in a tail call inside a block names the argument as written and where the block is', function()
  local Project = nn.block('Project', function(self) self.W = nn.Parameter(torch.randn(3, 2)) end)
  function Project:forward(h) return h:matmul(self.W) end   -- a tail call: its own frame is gone
  local seq = nn.Sequential{nn.Linear(4, 4), Project()}
  local ok, err = pcall(function() local y = seq(torch.ones(1, 4)) return y end)
  eq(ok, false)
  assert(err:find("in block 2 %(Project, forward at [^)]*test_nn%.lua:%d+%) of nn%.Sequential"), err)
  assert(err:find("bad argument #1 to 'matmul' (shapes 1x4 and 3x2 cannot be multiplied)", 1, true), err)
end)

test('m:device(): where the parameters are, else the default device', function()
  eq(nn.Linear(2, 3):device(), torch.device(), 'built on the default device')
  eq(nn.Linear(2, 3):to('cpu'):device(), 'cpu')
  eq(nn.ReLU():device(), torch.device(), 'no parameters')
  if torch.cuda.is_available() then eq(nn.Linear(2, 3):to('cuda'):device(), 'cuda:0') end
end)

-- lua_api (seed 3): nn.sinkhorn with 2^53 iterations ran for ever.
test('nn.sinkhorn takes a bounded number of iterations', function()
  raises(function() nn.sinkhorn(torch.zeros(2, 2), 2 ^ 53) end, 'nn.sinkhorn: iters must be an integer in 0..100000, got 9.007199254741e+15')
  raises(function() nn.sinkhorn({}, 3) end, 'nn.sinkhorn: logits must be a Tensor, got table')
  local m = nn.sinkhorn(torch.zeros(2, 2), 3)
  eq(m:sum(1):tolist(), {1, 1})
end)

-- Misuse accepted silently: m.weight = t on a built-in block was stored as a
-- field while the C++ block went on using its own tensor.
test('assigning a built-in block\'s parameter is an error that says how to change it; reading it still works', function()
  local m = nn.Linear(3, 2)
  local w = m.weight
  raises(function() m.weight = torch.zeros(2, 3) end,
    'nn.Linear.weight: the parameter of a built-in block cannot be replaced (its forward keeps using its own tensor); '
    .. 'copy into it instead: torch.no_grad(function() m.weight:copy_(t) end), or m:load_state_dict{weight = t}')
  eq(rawequal(m.weight, w), true)
  torch.no_grad(function() m.weight:copy_(torch.zeros(2, 3)) end)
  eq(m(torch.ones(1, 3)):sub(m.bias:view(1, 2)):abs():max():item(), 0, 'the forward uses the copied weight')
  -- a subclass of a built-in block reads and guards its parameters the same way
  local Sub = nn.class('Sub', nn.LayerNorm)
  local s = Sub(4)
  eq(s.weight:size(1), 4)
  raises(function() s.bias = torch.zeros(4) end, 'Sub.bias: the parameter of a built-in block cannot be replaced (its forward keeps using its own tensor); '
    .. 'copy into it instead: torch.no_grad(function() m.bias:copy_(t) end), or m:load_state_dict{bias = t}')
  -- other fields are still free
  m.note = 'mine'
  eq(m.note, 'mine')
end)

-- A forward that calls its own module looped forever as tail calls that
-- LuaJIT compiled, where Ctrl-C cannot reach.
test('a model given text, 1-D ids or floats says what to pass, at the caller\'s line', function()
  local m = models.gpt{vocab = 10, dim = 16, heads = 2, layers = 1, seq = 8, ffn = 16}
  raises(function() m('hello world') end, "models.GPT: the input is text ('hello world'); a model takes token ids (B, T): "
    .. "tok:encode(text), or probe.to_ids(model, text, {tokenizer = tok}) (probe.run_with_cache and probe.test_prompt take text themselves)")
  raises(function() m(torch.tensor({1, 2, 3}):long()) end, 'models.GPT: token ids must be (B, T), got 3: ids:unsqueeze(1) makes a batch of one')
  raises(function() m(torch.tensor({{1, 2, 3}})) end, 'models.GPT: token ids must be int64, got float32 (ids:long() converts whole numbers)')
  local ok, err = pcall(function() m('x') end)
  assert(tostring(err):find('test_nn%.lua:%d+: models%.GPT'), 'the error is at the caller: ' .. tostring(err))
  local pre = models.gpt{vocab = 10, dim = 16, heads = 2, layers = 1, seq = 8, ffn = 16, norm = 'pre'}
  local l, dev = lens.logit(pre), pre:device()
  raises(function() l:readout(1, torch.zeros(1, 2, 16, {dtype = 'float64'}):to(dev)) end,
    ("lens:readout: h is float64 on %s, the model float32 on %s (h:to('float32') converts it)"):format(dev, dev))
end)

test('a module whose forward calls itself ends in a stack overflow error', function()
  local Loop = nn.class('Loop', nn.Module)
  function Loop:forward(x) return self(x) end
  raises(function() return Loop()(torch.ones(2)) end, 'stack overflow')
  local Two = nn.class('Two', nn.Module)
  function Two:forward(x) return x, 2 end
  local a, b = Two()(torch.ones(1))
  eq(b, 2, 'a forward still returns all its values')
end)

-- A model containing itself: every walk over it (forward, parameters) recursed without end.
test('a module cannot be added inside itself or its own children', function()
  local s = nn.Sequential{nn.Linear(2, 2)}
  raises(function() s:add(s) end, "nn.Sequential: cannot add nn.Sequential as '2': it is the module itself, and a model cannot contain itself")
  local outer = nn.Sequential{s}
  raises(function() s.back = outer end, "nn.Sequential: cannot add nn.Sequential as 'back': it contains this module, and a model cannot contain itself")
  eq(#s:parameters(), 2)
  local shared = nn.Linear(2, 2)
  local twice = nn.Sequential{shared, shared}  -- the same module twice is no cycle
  eq(twice(torch.ones(1, 2)):size(2), 2)
end)

test('nn.format_count separates thousands of negative counts too (one implementation, render/format.lua)', function()
  eq(nn.format_count(1611329), '1,611,329')
  eq(nn.format_count(-123456), '-123,456')
  eq(nn.format_count(999), '999')
  eq(nn.format_count(-1000), '-1,000')
end)

H.done()
