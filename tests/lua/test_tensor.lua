-- Tensors from Lua: creation, dtypes, shapes, views and conversions.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, close, raises = H.test, H.eq, H.close, H.raises

test('torch.tensor infers shape, defaults to float32, keeps values', function()
  local x = torch.tensor({{1, 2, 3}, {4, 5, 6}})
  eq(x:size(), {2, 3}, 'size')
  eq(x.dtype, 'float32', 'dtype')
  eq(x:tolist(), {{1, 2, 3}, {4, 5, 6}}, 'tolist')
  eq(torch.tensor(2.5):dim(), 0, 'scalar dim')
  eq(torch.tensor(2.5):item(), 2.5, 'scalar item')
  eq(torch.tensor({true, false}).dtype, 'bool')
  eq(torch.tensor({1, 2}, {dtype = 'int64'}):tolist(), {1, 2})
  eq(torch.tensor({}).shape, {0})
end)

test('factories take sizes as numbers or a table, and options', function()
  eq(torch.zeros(2, 3):size(), {2, 3})
  eq(torch.ones({4}):sum():item(), 4)
  eq(torch.full({2, 2}, 7):tolist(), {{7, 7}, {7, 7}})
  eq(torch.empty(3, {dtype = 'float64'}).dtype, 'float64')
  eq(torch.eye(3):sum():item(), 3)
  eq(torch.eye(2, 3):size(), {2, 3})
  eq(torch.arange(5):tolist(), {0, 1, 2, 3, 4})
  eq(torch.arange(5).dtype, 'int64')
  eq(torch.arange(1, 2, 0.25).dtype, 'float32')
  close(torch.linspace(0, 1, 5), {0, 0.25, 0.5, 0.75, 1})
  local r = torch.randint(3, 7, {1000})
  eq(r.dtype, 'int64')
  assert(r:min():item() >= 3 and r:max():item() <= 6, 'randint bounds are [low, high)')
  local u = torch.rand(10000)
  assert(u:min():item() >= 0 and u:max():item() < 1)
  local n = torch.randn(20000)
  assert(math.abs(n:mean():item()) < 0.05 and math.abs(n:std():item() - 1) < 0.05, 'randn is standard normal')
  local z = torch.zeros_like(n)
  eq(z:sum():item(), 0)
  eq(torch.ones_like(torch.zeros(2, {dtype = 'float64'})).dtype, 'float64')
  eq(torch.full_like(torch.zeros(2), 3):tolist(), {3, 3})
  eq(torch.randn_like(torch.zeros(3, 2)):size(), {3, 2})
  eq(torch.zeros(2, {requires_grad = true}).requires_grad, true)
end)

test('manual_seed makes random tensors repeat', function()
  torch.manual_seed(123)
  local a = torch.randn(5)
  torch.manual_seed(123)
  local b = torch.randn(5)
  assert(torch.equal(a, b))
end)

test('dtypes convert', function()
  local x = torch.tensor({1.7, -2.2})
  eq(x:long():tolist(), {1, -2})
  eq(x:double().dtype, 'float64')
  eq(x:to('float16').dtype, 'float16')
  eq(x:to('bfloat16').dtype, 'bfloat16')
  eq(x:to({dtype = 'int32'}).dtype, 'int32')
  eq(x:to(torch.zeros(1, {dtype = 'float64'})).dtype, 'float64')
  eq(x:to('cpu').device, 'cpu')
  eq(x:bool():tolist(), {true, true})
  eq(torch.float32, 'float32')
end)

test('shape methods', function()
  local x = torch.arange(24):reshape(2, 3, 4)
  eq(x:dim(), 3)
  eq(x:numel(), 24)
  eq(x.shape, {2, 3, 4})
  eq(x:size(-1), 4)
  eq(#x, 2)
  eq(x:view(6, 4):size(), {6, 4})
  eq(x:view(-1):size(), {24})
  eq(x:reshape({4, -1}):size(), {4, 6})
  eq(x:flatten():size(), {24})
  eq(x:flatten(2):size(), {2, 12})
  eq(x:transpose(1, 3):size(), {4, 3, 2})
  eq(x:permute(3, 1, 2):size(), {4, 2, 3})
  eq(x:permute({3, 1, 2}):size(), {4, 2, 3})
  eq(x:unsqueeze(1):size(), {1, 2, 3, 4})
  eq(x:unsqueeze(-1):size(), {2, 3, 4, 1})
  eq(x:unsqueeze(4):size(), {2, 3, 4, 1})
  eq(x:unsqueeze(1):squeeze(1):size(), {2, 3, 4})
  eq(torch.zeros(1, 3, 1):squeeze():size(), {3})
  eq(torch.zeros(3, 1):expand(3, 5):size(), {3, 5})
  eq(torch.zeros(3, 1):expand(-1, 5):size(), {3, 5})
  eq(torch.zeros(2, 3):t():size(), {3, 2})
  eq(torch.zeros(2, 3).T:size(), {3, 2})
  eq(torch.tensor({1, 2}):tile(2, 2):tolist(), {{1, 2, 1, 2}, {1, 2, 1, 2}})
  eq(torch.tensor({1, 2})['repeat'](torch.tensor({1, 2}), 2):tolist(), {1, 2, 1, 2})
  assert(not x:transpose(1, 2):is_contiguous())
  assert(x:transpose(1, 2):contiguous():is_contiguous())
end)

test('narrow, select, chunk, split, unbind (1-based)', function()
  local x = torch.arange(10)
  eq(x:narrow(1, 3, 4):tolist(), {2, 3, 4, 5})
  eq(x:select(1, 1):item(), 0)
  eq(x:select(1, -1):item(), 9)
  local c = x:chunk(3)
  eq(#c, 3)
  eq(c[1]:tolist(), {0, 1, 2, 3})
  eq(c[3]:tolist(), {8, 9})
  local s = x:split(4)
  eq(#s, 3)
  eq(s[3]:tolist(), {8, 9})
  local s2 = x:split({3, 7})
  eq(s2[2]:size(), {7})
  local m = torch.arange(6):reshape(2, 3)
  eq(m:chunk(3, 2)[2]:tolist(), {{1}, {4}})
  eq(#m:unbind(2), 3)
  raises(function() x:split({3, 3}) end, "bad argument #1 to 'split' (split sizes add up to 6 but dimension 1 has size 10)")
  raises(function() x:narrow(1, 8, 5) end, "bad argument #3 to 'narrow' (length 5 from index 8 runs past dimension 1 of size 10)")
end)

test('cat and stack (dim 1 by default)', function()
  local a, b = torch.ones(2, 3), torch.zeros(1, 3)
  eq(torch.cat({a, b}):size(), {3, 3})
  eq(torch.cat({a, a}, 2):size(), {2, 6})
  eq(torch.cat({a, a}, -1):size(), {2, 6})
  eq(torch.stack({a, a}):size(), {2, 2, 3})
  eq(torch.stack({a, a}, 3):size(), {2, 3, 2})
  raises(function() torch.stack({a, b}) end, "bad argument #1 to 'stack' (tensor 2 has shape 1x3, expected 2x3 like tensor 1)")
  raises(function() torch.cat({}) end, "bad argument #1 to 'cat' (expected a non-empty table of tensors)")
  raises(function() torch.cat({a, 3}) end, "bad argument #1 to 'cat' (entry 2 is number, expected a Tensor)")
end)

test('printing: header then a PyTorch-style body', function()
  local s = tostring(torch.tensor({{1.5, -2}, {3, 4}}, {device = 'cpu'}))
  eq(s, '[Tensor 2x2 float32 cpu]\ntensor([[ 1.5000, -2.0000],\n        [ 3.0000,  4.0000]])')
  local g = torch.ones(2, {requires_grad = true})  -- on the default device: its name in the header
  eq(tostring(g * g):match('^[^\n]*'), '[Tensor 2 float32 ' .. torch.device() .. ' requires_grad grad_fn=MulBackward0]')
  if torch.device() ~= 'cpu' then
    eq(tostring(torch.tensor({{1.5, -2}, {3, 4}})), '[Tensor 2x2 float32 ' .. torch.device() .. ']\ntensor([[ 1.5000, -2.0000],\n        [ 3.0000,  4.0000]])')
  end
  torch.set_printoptions({precision = 2})
  eq(tostring(torch.tensor({1.5, 2.25})):match('\n(.*)'), 'tensor([1.50, 2.25])')
  torch.set_printoptions({precision = 4})
  assert(tostring(torch.zeros(2000)):find('...', 1, true), 'large tensors are summarised')
end)

test('the metatable is protected and identity is ==', function()
  local x = torch.zeros(2)
  eq(getmetatable(x), 'Tensor')
  assert(not pcall(setmetatable, x, {}))
  local y = x
  assert(x == y)
  assert(x ~= torch.zeros(2))
  assert(x:view(2) ~= x, 'a view is another tensor')
  eq(torch.is_tensor(x), true)
  eq(torch.is_tensor({}), false)
end)

test('tensors are collected', function()
  collectgarbage()
  local before = collectgarbage('count')
  for _ = 1, 20000 do local _ = torch.zeros(4) + 1 end
  -- two cycles: a userdata with a finalizer is freed in the cycle after its
  -- __gc ran (one cycle left up to ~1 MB of them, close to the old bound)
  collectgarbage()
  collectgarbage()
  assert(collectgarbage('count') < before + 64, 'userdata are freed by the GC')
end)

test('torch.cpu: freed buffers of 1 MiB and more are reused, up to a limit; empty_cache gives them back', function()
  local n = 2 ^ 20  -- 4 MiB of float32
  local function drop() collectgarbage(); collectgarbage() end  -- the argument, a temporary, is freed
  torch.cpu.empty_cache()
  local before = torch.cpu.memory_stats()  -- limit 0 in a sanitizer build: set one here
  torch.cpu.set_cache_limit(64 * 2 ^ 20)
  drop(torch.full({n}, 7, {device = 'cpu'}))
  local s = torch.cpu.memory_stats()
  assert(s.pooled_bytes >= 4 * n, 'the freed buffer is pooled: ' .. s.pooled_bytes)
  local z = torch.zeros(n, {device = 'cpu'})  -- the same size class: the pooled buffer, cleared by zeros
  eq(torch.cpu.memory_stats().reused, s.reused + 1, 'served from the pool')
  eq(z:abs():sum():item(), 0, 'a reused buffer holds what the factory wrote')
  local e = torch.empty(n - 1000, {device = 'cpu'})  -- within an eighth: the same class
  eq(e:numel(), n - 1000)
  z, e = nil, nil
  drop()
  assert(torch.cpu.empty_cache() >= 8 * n, 'empty_cache returns the bytes it freed')
  eq(torch.cpu.memory_stats().pooled_bytes, 0)
  torch.cpu.set_cache_limit(0)
  drop(torch.ones(n))
  eq(torch.cpu.memory_stats().pooled_bytes, 0, 'limit 0 keeps nothing')
  torch.cpu.set_cache_limit(before.limit)
  eq(torch.cpu.memory_stats().limit, before.limit)
  raises(function() torch.cpu.set_cache_limit(-1) end, "torch.cpu.set_cache_limit: bytes must be a whole number from 0 to 2^63 or a size such as '2G', got -1")
  raises(function() torch.cpu.set_cache_limit(0 / 0) end, "or a size such as '2G', got nan")
  raises(function() torch.cpu.set_cache_limit(1e300) end, 'got 1e+300')
  torch.cpu.set_cache_limit('1.5M')  -- the environment variable's form
  eq(torch.cpu.memory_stats().limit, 1.5 * 2 ^ 20)
  raises(function() torch.cpu.set_cache_limit('1T') end, "or a size such as '2G', got '1T'")
  raises(function() torch.cpu.set_cache_limit({}) end, 'got a table')
  torch.cpu.set_cache_limit(before.limit)
end)

test('an option of the wrong kind is an error naming it, never read as true (every binding reads options one way)', function()
  local x = torch.ones(2, 3)
  raises(function() x:sum({dim = 1, keepdim = 'no'}) end, "bad argument #1 to 'sum' (option 'keepdim': true or false expected, got string)")
  raises(function() x:std({unbiased = 0}) end, "option 'unbiased': true or false expected, got number)")
  raises(function() x:to({dtype = 64}) end, "option 'dtype': string expected, got number)")
  raises(function() torch.zeros(2, {requires_grad = 'yes'}) end, "option 'requires_grad': true or false expected, got string)")
  raises(function() torch.set_printoptions({sci_mode = 1}) end, "option 'sci_mode': true or false expected, got number)")
  eq(x:sum({dim = 1, keepdim = false}):size(), {3})
end)

test('a nil, NaN, fractional or negative size is an error naming the argument', function()
  H.raises_part(function() torch.randn(nil, 3) end, "bad argument #1 to 'randn' (size expected, got nil (a size is missing))")
  H.raises_part(function() torch.ones(2, nil, 3) end, "bad argument #2 to 'ones' (size expected, got nil (a size is missing))")
  H.raises_part(function() torch.zeros(2, nil) end, "bad argument #2 to 'zeros' (size expected, got nil")
  H.raises_part(function() torch.zeros(nil) end, "bad argument #1 to 'zeros' (size expected, got nil")
  H.raises_part(function() torch.zeros({2, nil, 3}) end, "bad argument #1 to 'zeros' (the size list has a hole: entry 2 is nil but entry 3 is not)")
  H.raises_part(function() torch.zeros(0 / 0) end, "bad argument #1 to 'zeros' (integer expected")
  H.raises_part(function() torch.zeros(2.5) end, "bad argument #1 to 'zeros' (integer expected, got 2.5)")
  H.raises_part(function() torch.zeros(-1) end, "sizes must be non-negative")
  H.raises_part(function() torch.zeros({2, 0 / 0}) end, 'entry 2 is not')
  local x = torch.ones(2, 3)
  H.raises_part(function() x:view(nil, 6) end, "bad argument #1 to 'view' (size expected, got nil")
  H.raises_part(function() x:view(6, nil) end, "bad argument #2 to 'view' (size expected, got nil")
  H.raises_part(function() x:reshape(3, nil) end, "bad argument #2 to 'reshape' (size expected, got nil")
  H.raises_part(function() x:expand(nil, 2, 3) end, "bad argument #1 to 'expand' (size expected, got nil")
  H.raises_part(function() x:tile(2, nil, 2) end, "bad argument #2 to 'tile' (size expected, got nil")
  H.raises_part(function() x:permute(2, nil) end, "bad argument #2 to 'permute' (size expected, got nil")
  H.raises_part(function() x:view({3, nil, 2}) end, 'the size list has a hole')
  H.raises_part(function() torch.tensor({1, nil, 3}) end, 'the nested table has a hole: entry 2 is nil but entry 3 is not')
  H.raises_part(function() return x[{1, nil, 2}] end, 'bad index (the index table has a hole')
  H.raises_part(function() torch.cat({x, nil, x}) end, 'entry 2 is nil')
  -- a key no integer type holds (found by the Lua-API fuzzer under UBSan: the message cast it to long long)
  H.raises_part(function() torch.tensor({1, 2, [1e308] = 3}) end, 'the nested table has a hole: entry 3 is nil but entry 1e+308 is not')
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
    H.raises_part(function() return tostring_size(v) end, 'table expected')
  end
  eq(tostring_size({2, 'a', {}}), '{2, string, table}')
  eq(tostring(torch.ones(2, 3):size()), '{2, 3}')
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
  H.raises_part(function() return t + 1 end, 'attempt to perform arithmetic')
  H.raises_part(function() return torch.zeros(2):add(t) end, 'Tensor or number expected, got userdata')
  local c = data.from_string(('abc '):rep(30))
  debug.getmetatable(c._native).__gc(c._native)
  H.raises_part(function() return c:tokens() end, "attempt to index field '_native'")
  collectgarbage()
  collectgarbage()
  eq(torch.ones(2):sum():item(), 2, 'the session goes on')
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

-- lua_api under UBSan (seeds 2-4): a number at or past 2^63 where an integer
-- is expected was converted to int64 regardless (undefined; it wrapped).
test('an integer argument past 2^63 is an error, not a wrapped value', function()
  raises(function() torch.ones(2 ^ 64) end, "bad argument #1 to 'ones' (integer out of range (-2^63 .. 2^63 - 1), got 1.844674407371e+19)")
  raises(function() torch.zeros(3, 3):triu(2 ^ 63) end, "bad argument #1 to 'triu' (integer out of range (-2^63 .. 2^63 - 1), got 9.2233720368548e+18)")
  raises(function() torch.zeros({2 ^ 63}) end, "bad argument #1 to 'zeros' (sizes must be integers below 2^63 (entry 1 is not))")
  eq(torch.zeros(3, 3):triu(2 ^ 62):size(), {3, 3})
end)

-- lua_api under UBSan (seed 15): reshape's element count overflowed int64.
test('a reshape to more elements than int64 can count is an error', function()
  raises(function() torch.zeros(3, 2):reshape(2 ^ 53, 1000000) end,
    "bad argument #1 to 'reshape' (shape 9007199254740992x1000000 has more elements than an int64 can count)")
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

H.done()
