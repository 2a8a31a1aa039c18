-- Regression tests for what the fuzz targets (tests/fuzz, scripts/fuzz)
-- found, each named after what it does; the fix is in the library, and the
-- input that found it is here in its smallest form. (The tokenizer.json
-- findings are in test_tokenizer.lua, beside the reader's other refusals.)
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require 'harness'
local test, eq, raises = H.test, H.eq, H.raises
local json = require 'anatomy.io.json'

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

-- A hardware trap pcall cannot catch: on integers, the smallest value modulo
-- -1 overflows the division (SIGFPE; PyTorch 1.13 dies of it too).
test('integer remainder of the smallest value by -1 is 0, and by 0 an error', function()
  eq(torch.tensor({-2^63, 7, -7}, {dtype = 'int64'}):remainder(-1):tolist(), {0, 0, 0})
  eq((torch.tensor({-2^31}, {dtype = 'int32'}) % -1):tolist(), {0})
  eq((torch.tensor({-7, 7}, {dtype = 'int64'}) % torch.tensor({3, -1}, {dtype = 'int64'})):tolist(), {2, 0})
  eq((torch.tensor({-7.5}) % -1):tolist(), {-0.5})
  raises(function() return torch.tensor({5}, {dtype = 'int64'}) % 0 end, 'integer remainder by zero (a divisor is 0)')
end)

-- A resource taken at its word: set_num_threads(5000) hung the process in
-- OpenMP's thread start-up.
test('a thread count far beyond the cores is an error naming both', function()
  local before = torch.get_num_threads()
  local ok, err = pcall(torch.set_num_threads, 5000)
  eq(ok, false)
  assert(tostring(err):find("bad argument #1 to 'set_num_threads' (thread count 5000 is far beyond this machine's", 1, true), err)
  eq(torch.get_num_threads(), before)
end)

-- Memory asked for beyond what the machine has: refused before the kernel's
-- overcommit grants it (the OOM killer would end the session when it is touched).
test('a tensor larger than the memory left is an error that says both sizes', function()
  local ok, err = pcall(torch.zeros, 1e12)
  eq(ok, false)
  assert(tostring(err):find("cannot allocate 3725.3 GiB (4000000000000 bytes): this machine has", 1, true), err)
  ok, err = pcall(function() return torch.ones(1e5):outer(torch.ones(1e5)) end)
  eq(ok, false)
  assert(tostring(err):find("cannot allocate 37.3 GiB", 1, true), err)
  eq(torch.ones(3):sum():item(), 3, 'the session goes on')
end)

-- An exact computation that grows without bound: squaring a rational in a
-- loop doubles its size each time until GMP aborts on its allocation.
test('an exact value growing past the size limit is an error, not an abort', function()
  local R = torch._exact
  raises(function() local q = R.new('3/2'); for _ = 1, 64 do q = q * q end end,
    'the result would be an exact value of about 2.168e+07 bits, past the limit of 16777216 bits (numerator and denominator): the computation grows without bound')
  local limit = ' bits, past the limit of 16777216 bits (numerator and denominator): the computation grows without bound'
  raises(function() return (R.new('3/2') ^ 20000) ^ 65536 end, 'q ^ n would be an exact value of about 3.388e+09' .. limit)
  raises(function() return R.exp_bounds(R.new(2) ^ 5000, 64) end, 'e^q would be an exact value of an astronomical number of' .. limit)
  raises(function() return R.new(('9'):rep(6000000)) end, 'a fraction of 6000000 characters is past the limit of 16777216 bits an exact value may have)')
  eq(tostring(R.new('3/2') * 2), '3')
end)

-- A forward that calls its own module looped forever as tail calls that
-- LuaJIT compiled, where Ctrl-C cannot reach.
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

-- corpus (libFuzzer): Latin-1 text did not round-trip: the byte 0xE9 was
-- taken for the character é (U+00E9) and written back as two bytes.
test('a char corpus of text that is not UTF-8 gives back its exact bytes', function()
  local t = 'caf\233\n caf\195\169 \192\128 \237\160\128 \226\130'
  local c = data.from_string(t)
  eq(c:decode(c:encode(t)), t)
  -- 5 ASCII characters, é, and the bytes E9, C0, 80, ED, A0, E2, 82 each a symbol of its own
  eq(c.vocab_size, 13)
  raises(function() return c:encode('\250') end, "bad argument #1 to 'encode' (character byte 0xFA (not UTF-8) is not in the vocabulary)")
end)

-- A safetensors shape whose byte count wraps past 2^64 ([2^62 + 1] of F32 is
-- 2^64 + 4 bytes, which wraps to 4) passed the reader's size check and
-- reached LibTorch's raw "Storage size calculation overflowed".
test('a safetensors shape of more than 2^63 bytes is refused by the reader', function()
  local function craft(header, body)
    local len = ''
    for i = 0, 7 do len = len .. string.char(math.floor(#header / 256 ^ i) % 256) end
    return H.tmpfile(len .. header .. body)
  end
  local path = craft('{"x":{"dtype":"F32","shape":[4611686018427387905],"data_offsets":[0,4]}}', '\0\0\0\0')
  raises(function() return torch.load_safetensors(path) end,
    ("'%s' is not a valid safetensors file: tensor 'x' has a shape too large to exist: [4611686018427387905] of F32 is more than 2^63 bytes"):format(path))
  path = craft('{"x":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,4]}}', '\0\0\0\0')
  raises(function() return torch.load_safetensors(path) end,
    ("'%s' is not a valid safetensors file: tensor 'x' has a shape too large to exist: [18446744073709551615]"):format(path))
end)

-- A hook that runs the model again from inside its forward: the recursion
-- goes through the C++ blocks; it must end in an error (once, not a 44 KB
-- message with the place repeated a level at a time), and the model must
-- work once the hook is gone.
test('a hook that calls its own model ends in one stack overflow error, and the model goes on', function()
  local m = models.gpt{vocab = 7, dim = 8, heads = 2, layers = 1, seq = 4, ffn = 8}
  local x = torch.tensor({{1, 2, 3}}, {dtype = 'int64'})
  local h = probe.replace(m, 'blocks.1.attn.q', function(t) m(x); return t end)
  raises(function() return m(x) end,
    'in block 1 (models.GPTBlock) of nn.Repeat: stack overflow (the model was called again from inside its own forward, by the block or by a hook on it)')
  h:remove()
  local once = false
  h = probe.replace(m, 'blocks.1', function(t) if not once then once = true; m(x) end; return t end)
  eq(m(x):size(3), 7, 'a re-entrant call that ends is fine')
  h:remove()
  eq(m(x):size(3), 7)
end)

-- The SentencePiece model reader is Debian's libsentencepiece, behind the
-- plugin, which the sanitizer build cannot load (RTLD_DEEPBIND), so no
-- libFuzzer target reaches it. Here: 2000 mutations of a valid model (bytes
-- flipped, cut short, spliced, repeated), each loaded through the plugin and
-- used; it loads or raises an error with a message, and the session goes on.
test('mutated SentencePiece model files load or raise an error, never crash', function()
  local dir = os.tmpname()
  os.remove(dir)
  os.execute("mkdir -p '" .. dir .. "'")
  local text = dir .. '/t.txt'
  local f = assert(io.open(text, 'wb'))
  f:write(('hello world, hello there; the world is wide and the hour is late.\n'):rep(20))
  f:close()
  local ok, err = pcall(data.text, text, {tokenizer = 'sentencepiece', vocab_size = 40})
  if tostring(err):find('sanitizer build', 1, true) then
    os.execute("rm -rf '" .. dir .. "'")
    H.skip('the SentencePiece plugin is not loaded in the sanitizer build')
  end
  assert(ok, err)
  local model = H.read(dir .. '/t.txt.sp40.bpe.model')
  math.randomseed(11)
  local loaded, refused = 0, 0
  for i = 1, 2000 do
    local bytes = model
    local kind = i % 4
    if kind == 0 then  -- flip a few bytes
      for _ = 1, math.random(1, 4) do
        local k = math.random(#bytes)
        bytes = bytes:sub(1, k - 1) .. string.char(math.random(0, 255)) .. bytes:sub(k + 1)
      end
    elseif kind == 1 then  -- cut short
      bytes = bytes:sub(1, math.random(0, #bytes - 1))
    elseif kind == 2 then  -- splice two places
      local a, b = math.random(#bytes), math.random(#bytes)
      bytes = bytes:sub(1, a) .. bytes:sub(b)
    else  -- repeat a run
      local a = math.random(#bytes)
      local b = math.min(#bytes, a + math.random(1, 64))
      bytes = bytes:sub(1, b) .. bytes:sub(a, b) .. bytes:sub(b + 1)
    end
    local path = dir .. '/m' .. i .. '.model'
    local g = assert(io.open(path, 'wb')); g:write(bytes); g:close()
    local good, c = pcall(data.text, text, {tokenizer = 'sentencepiece', model = path})
    if good then
      loaded = loaded + 1
      local used, uerr = pcall(function() return c:decode(c:encode('hello there')) end)
      assert(used or (type(uerr) == 'string' and uerr ~= ''), 'an error without a message')
    else
      refused = refused + 1
      assert(type(c) == 'string' and c ~= '', 'an error without a message')
    end
    os.remove(path)
  end
  print(('       %d of 2000 mutations loaded, %d refused'):format(loaded, refused))
  eq(loaded + refused, 2000)
  assert(refused > 0 and loaded > 0, 'some mutations load and some are refused')
  os.execute("rm -rf '" .. dir .. "'")
end)

-- lua_api under UBSan: the fraction suggested for a number that is not an
-- integer converted 1e308 to long long (undefined), and the convergents'
-- products could leave its range.
test('the fraction suggested for a number stays in range, and is nil when none comes close', function()
  local R = torch._exact
  eq(R.suggest(1e308), nil)
  eq(R.suggest(1e-300), nil)
  eq(R.suggest(0.1), '1/10')
  eq(R.suggest(-2.5), '-5/2')
  raises(function() return R.new(0.1) end, "bad argument #1 to 'exact.new' (expected an integer or a fraction written as a string, got 0.1 (write '1/10' for an exact fraction))")
end)

-- lua_api, the long run (seed 1, call 534088; the minimizer cut it to that
-- one call): chunking an empty tensor into 10^12 pieces asked for 8 TB of
-- tensor handles at once; ASan's allocator aborted the process.
test('chunks of an empty dimension are bounded; small counts behave as in PyTorch', function()
  raises(function() return torch.zeros(0):chunk(1e12) end,
    "bad argument #1 to 'chunk' (1000000000000 chunks of an empty dimension would be 1000000000000 empty tensors (at most 1048576))")
  eq(#torch.zeros(0):chunk(7), 7)
  eq(#torch.zeros(3):chunk(1e12), 3)
end)

-- tokenizer_json, the long run: a vocabulary with an empty token (and two
-- tokens sharing an id) encoded a text to an id that decoding then took for
-- a hole in the vocabulary, and threw std::out_of_range ("token id 264 is out
-- of range 1..269") past the reader's error type.
test('a tokenizer.json whose vocabulary has an empty token or a shared id is refused when it loads', function()
  local json = require 'anatomy.io.json'
  local function layout(vocab)
    return H.tmpfile(json.encode{version = '1.0', added_tokens = {}, normalizer = json.null,
      pre_tokenizer = {type = 'ByteLevel', add_prefix_space = false, use_regex = true}, post_processor = json.null,
      decoder = {type = 'ByteLevel'}, model = {type = 'BPE', dropout = json.null, unk_token = json.null, fuse_unk = false,
        byte_fallback = false, vocab = vocab, merges = {}}})
  end
  local path = layout({a = 0, [''] = 1})
  raises(function() return data.tokenizer(path) end, ("'%s': the vocabulary has an empty token (id 1)"):format(path))
  path = layout({a = 0, b = 0})
  local ok, err = pcall(data.tokenizer, path)
  eq(ok, false)
  assert(tostring(err):find("have the same id 0", 1, true), err)
end)

-- lua_api in CI (seed 509252466, calls 208-209): x:repeat(10^6) of a 5 KB
-- tensor was 5 GB, within the memory left, and took 24 s to fill under ASan:
-- a call that reads as a hang. $ANATOMY_MAX_ALLOCATION caps one allocation
-- (the fuzzers set 512 MiB; a user can keep a session small with it).
test('ANATOMY_MAX_ALLOCATION caps one allocation with an error that names it', function()
  local exe = torch._data.realpath('/proc/self/exe')  -- this anatomy
  local p = io.popen(("ANATOMY_MAX_ALLOCATION=512M '%s' -e \"print(pcall(torch.Tensor[ [[repeat]] ], torch.zeros(5056, {dtype = 'uint8'}), 1000000)); print(torch.zeros(2^20):numel())\" 2>&1"):format(exe))
  local out = p:read('*a')
  p:close()
  assert(out:find("cannot allocate 4.7 GiB (5056000000 bytes): more than the 0.5 GiB a single allocation may take ($ANATOMY_MAX_ALLOCATION)", 1, true), out)
  assert(out:find('\n1048576', 1, true), 'smaller allocations go on: ' .. out)
end)

H.done()
