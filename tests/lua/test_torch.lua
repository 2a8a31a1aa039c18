-- The torch table completed in Lua (lua/anatomy/torch/) and the runtime under
-- it: script configs, option checks and where their errors point, threads,
-- and the memory guard.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local native = require('anatomy.torch.native')
local test, eq, close, raises = H.test, H.eq, H.close, H.raises
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')


test('errors point at the right place: unknown keys first with the closest name, train.fit names its option, options tables are their own argument', function()
  local ok, err = pcall(function() return models.vibenet{vocab = 65, dimm = 64, layers = 2, seq = 32} end)
  assert(not ok)
  assert(err:find("models.vibenet: unknown config key 'dimm', did you mean 'dim'?", 1, true), err)
  assert(err:find('^[^:]*test_torch%.lua:%d+:'), 'at the caller\'s line: ' .. err)
  local corpus = data.from_string(string.rep('abc def ', 100))
  local m = models.gpt{vocab = corpus.vocab_size, dim = 16, heads = 2, layers = 1, seq = 8, ffn = 32}
  H.raises_part(function() train.fit(m, corpus, {lr = '3e-3'}) end, "train.fit: option lr must be a positive number, got the string '3e-3'")
  H.raises_part(function() train.fit(m, corpus, {steps = 2.5}) end, 'train.fit: option steps must be a positive integer, got 2.5')
  H.raises_part(function() train.fit(m, corpus, {lr = 0 / 0}) end, 'train.fit: option lr must be a positive number, got nan')
  H.raises_part(function() train.fit(m, corpus, {schedule = 'linear'}) end, "option schedule must be 'cosine' or 'constant'")
  H.raises_part(function() train.fit(m, corpus, {betas = {0.9}}) end, 'option betas must be two numbers in [0, 1), got {0.9}')
  local x = torch.ones(2, 3)
  H.raises_part(function() return x:sum({dim = 3}) end, "bad argument #1 to 'sum' (option 'dim': dimension 3 out of range")
  H.raises_part(function() return x:clamp({min = 'a'}) end, "bad argument #1 to 'clamp' (option 'min': number expected, got string)")
end)

-- lua_readers: torch.config.parse with --help in a table ended the process
-- (os.exit), and a REPL session with it.
test('torch.config.parse with --help from a table prints the options and returns the defaults', function()
  local c = torch.config.parse({steps = 10, lr = 0.5}, {'--help'})
  eq(c.steps, 10)
  eq(c.lr, 0.5)
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
  -- the CPU's guard (host/memory_guard.cpp): a GPU's allocator says CUDA's own message
  local ok, err = pcall(torch.zeros, 1e12, {device = 'cpu'})
  eq(ok, false)
  assert(tostring(err):find("cannot allocate 3725.3 GiB (4000000000000 bytes): this machine has", 1, true), err)
  ok, err = pcall(function() return torch.ones(1e5, {device = 'cpu'}):outer(torch.ones(1e5, {device = 'cpu'})) end)
  eq(ok, false)
  assert(tostring(err):find("cannot allocate 37.3 GiB", 1, true), err)
  eq(torch.ones(3):sum():item(), 3, 'the session goes on')
end)

-- lua_api in CI (seed 509252466, calls 208-209): x:repeat(10^6) of a 5 KB
-- tensor was 5 GB, within the memory left, and took 24 s to fill under ASan:
-- a call that reads as a hang. $ANATOMY_MAX_ALLOCATION caps one allocation
-- (the fuzzers set 512 MiB; a user can keep a session small with it).
test('ANATOMY_MAX_ALLOCATION caps one allocation with an error that names it', function()
  local exe = native.data.realpath('/proc/self/exe')  -- this anatomy
  local p = io.popen(("ANATOMY_MAX_ALLOCATION=512M '%s' -e \"print(pcall(torch.Tensor[ [[repeat]] ], torch.zeros(5056, {dtype = 'uint8', device = 'cpu'}), 1000000)); print(torch.zeros(2^20, {device = 'cpu'}):numel())\" 2>&1"):format(exe))
  local out = p:read('*a')
  p:close()
  assert(out:find("cannot allocate 4.7 GiB (5056000000 bytes): more than the 0.5 GiB a single allocation may take ($ANATOMY_MAX_ALLOCATION)", 1, true), out)
  assert(out:find('\n1048576', 1, true), 'smaller allocations go on: ' .. out)
end)

-- A native fault (a library's bug, a plugin on a corrupt file) ends the
-- process as the signal does, after the native stack on stderr: on the GPU
-- machine two SentencePiece crashes left logs that said nothing of where.
test('a native crash prints the native stack, then ends by its signal', function()
  local exe = native.data.realpath('/proc/self/exe')
  local p = io.popen(("'%s' -e \"local ffi = require('ffi'); print(ffi.cast('int*', 0)[0])\" 2>&1; echo \"exit $?\""):format(exe))
  local out = p:read('*a')
  p:close()
  if out:find('AddressSanitizer', 1, true) then return end  -- the sanitizer build reports it itself
  assert(out:find('anatomy: fatal signal SIGSEGV; the native stack', 1, true), out)
  assert(out:find('lua_pcall', 1, true), 'a frame by name: ' .. out)
  assert(out:find('\nexit 139\n', 1, true), 'the status of a SIGSEGV (128 + 11): ' .. out)
end)

test('torch.profiler.count_ops counts the operators of a call and the reads of a device tensor to the host', function()
  local x = torch.ones(64, 64)  -- past the few elements host/small_arith.cpp computes without the dispatcher
  local c, a, b = torch.profiler.count_ops(function(y) return (x + y):sum(), 'second' end, x)
  eq(a:item(), 2 * 64 * 64, "fn's results come after the counts")
  eq(b, 'second')
  assert((c.by_name['aten::add'] or 0) >= 1 and (c.by_name['aten::sum'] or 0) >= 1, 'x + y, then sum')
  local total = 0
  for _, n in pairs(c.by_name) do total = total + n end
  eq(c.ops, total, 'ops is the sum over names')
  eq(c.syncs, 0, 'no read back to the host')
  -- item() of a tensor on a device waits for it; on the CPU nothing waits
  local on_device = x.device ~= 'cpu'
  local r = torch.profiler.count_ops(function() return x:sum():item() + x:max():item() end)
  eq(r.syncs, on_device and 2 or 0, 'two items on ' .. x.device)
  eq(r.syncs_by_name['aten::_local_scalar_dense'], on_device and 2 or nil)
  local host = torch.profiler.count_ops(function() return x:to('cpu') end)
  eq(host.syncs, on_device and 1 or 0, 'a copy to the CPU')
  local cpu = torch.ones(8, {device = 'cpu'})
  eq(torch.profiler.count_ops(function() return cpu:to(x.device) end).syncs, on_device and 1 or 0, 'a blocking copy from the CPU')
  -- an error in fn propagates, and the count stops with it
  raises(function() torch.profiler.count_ops(function() error('inside') end) end, 'inside')
  assert(torch.profiler.count_ops(function() return x * x end).by_name['aten::mul'], 'a new count after an error')
  raises(function() torch.profiler.count_ops(42) end, "bad argument #1 to 'profiler.count_ops' (function expected, got number)")
  raises(function() torch.profiler.count_ops(function() torch.profiler.count_ops(function() end) end) end,
    "error in 'profiler.count_ops' (an operator count is already under way (one at a time))")
end)

H.done()
