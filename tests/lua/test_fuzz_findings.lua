-- Regression tests for what the fuzz targets (tests/fuzz, scripts/fuzz)
-- found, each named after what it does; the fix is in the library, and the
-- input that found it is here in its smallest form. (The tokenizer.json
-- findings are in test_tokenizer.lua, beside the reader's other refusals.)
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require 'harness'
local test, eq, raises = H.test, H.eq, H.raises
local json = require 'anatomy.json'

-- lua_readers: a string with DEL (0x7f) in it made json.decode loop forever
-- (Lua's %c matches DEL; the scan made no progress on it).
test('json.decode takes DEL as the ordinary character it is, and an unterminated string ends in an error', function()
  eq(json.decode('"a\127b"'), 'a\127b')
  eq(json.decode('{"k": "\127\127"}').k, '\127\127')
  raises(function() json.decode('"\127\127\127-') end, 'json.decode: unterminated string at byte 6')
  raises(function() json.decode('"a\1b"') end, 'json.decode: control character in a string at byte 3')
end)

-- lua_readers: torch.config.parse with --help in a table ended the process
-- (os.exit), and a REPL session with it.
test('torch.config.parse with --help from a table prints the options and returns the defaults', function()
  local c = torch.config.parse({steps = 10, lr = 0.5}, {'--help'})
  eq(c.steps, 10)
  eq(c.lr, 0.5)
end)

-- The metrics log a run killed mid-write leaves: its last line cut short.
test('train.read_metrics skips a last line cut short and refuses a bad line elsewhere', function()
  local path = os.tmpname()
  local f = io.open(path, 'wb')
  f:write('{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.25}\n{"step": 3, "lo')
  f:close()
  local r = train.read_metrics(path)
  eq(#r, 2)
  eq(r[2].loss, 2.25)
  f = io.open(path, 'wb')
  f:write('{"step": 1}\nnot json\n{"step": 3}\n')
  f:close()
  raises(function() train.read_metrics(path) end, ('train.read_metrics: %s: line 2 is not a JSON object: json.decode: unexpected \'n\' at byte 1'):format(path))
  os.remove(path)
  raises(function() train.read_metrics(path) end, ('train.read_metrics: cannot open %s: No such file or directory'):format(path))
end)

-- lua_api (seed 4): a table that contains itself, given to torch.tensor,
-- recursed until the C stack overflowed (SIGSEGV: the session was gone).
test('torch.tensor of a table that contains itself is an error', function()
  local t = {}
  t[1] = t
  raises(function() torch.tensor(t) end, "bad argument #1 to 'tensor' (nested table deeper than 64 levels (a table that contains itself?))")
  local deep = {}
  local d = deep
  for _ = 1, 100 do d[1] = {}; d = d[1] end
  raises(function() torch.tensor(deep) end, "bad argument #1 to 'tensor' (nested table deeper than 64 levels (a table that contains itself?))")
end)

-- lua_api (seed 3): nn.sinkhorn with 2^53 iterations ran for ever.
test('nn.sinkhorn takes a bounded number of iterations', function()
  raises(function() nn.sinkhorn(torch.zeros(2, 2), 2 ^ 53) end, 'nn.sinkhorn: iters must be an integer in 0..100000, got 9.007199254741e+15')
  raises(function() nn.sinkhorn({}, 3) end, 'nn.sinkhorn: logits must be a Tensor, got table')
  local m = nn.sinkhorn(torch.zeros(2, 2), 3)
  eq(m:sum(1):tolist(), {1, 1})
end)

-- lua_api under UBSan (seeds 2-4): a number at or past 2^63 where an integer
-- is expected was converted to int64 regardless (undefined; it wrapped).
test('an integer argument past 2^63 is an error, not a wrapped value', function()
  raises(function() torch.ones(2 ^ 64) end, "bad argument #1 to 'ones' (integer out of range (-2^63 .. 2^63 - 1), got 1.844674407371e+19)")
  raises(function() torch.zeros(3, 3):triu(2 ^ 63) end, "bad argument #1 to 'triu' (integer out of range (-2^63 .. 2^63 - 1), got 9.2233720368548e+18)")
  raises(function() torch.zeros({2 ^ 63}) end, "bad argument #1 to 'zeros' (sizes must be integers below 2^63 (entry 1 is not))")
  eq(torch.zeros(3, 3):triu(2 ^ 62):size(), {3, 3})
end)

-- Misuse accepted silently: x.grad took a tensor of another shape, or x itself.
test('x.grad takes a gradient of x\'s shape, dtype and device only', function()
  local w = torch.randn(3):requires_grad_()
  raises(function() w.grad = torch.randn(5) end, "bad argument #3 to '__newindex' (grad has shape 5, the tensor 3)")
  raises(function() w.grad = w end, "bad argument #3 to '__newindex' (a tensor cannot be its own grad)")
  raises(function() w.grad = torch.ones(3):double() end, "bad argument #3 to '__newindex' (grad is float64 on cpu, the tensor float32 on cpu)")
  w.grad = torch.ones(3)
  eq(w.grad:sum():item(), 3)
  w.grad = nil
  eq(w.grad, nil)
end)

-- lua_api under UBSan (seed 15): reshape's element count overflowed int64.
test('a reshape to more elements than int64 can count is an error', function()
  raises(function() torch.zeros(3, 2):reshape(2 ^ 53, 1000000) end,
    "bad argument #1 to 'reshape' (shape 9007199254740992x1000000 has more elements than an int64 can count)")
end)

-- lua_api under UBSan (seed 55): an index entry past 2^63 (x[{2^64}]) was
-- converted to int64 regardless.
test('an index entry past 2^63 is an error', function()
  raises(function() return torch.zeros(2, 2)[{2 ^ 64}] end, 'bad index entry 1 (integer expected, got 18446744073709551616.000000)')
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

H.done()
