-- Indexing is 1-based, negative from the end, in Torch7's table form; index
-- tensors given to and returned from LibTorch are 1-based too.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, raises = H.test, H.eq, H.raises

local function m() return torch.arange(12):reshape(3, 4) end  -- rows {0..3}, {4..7}, {8..11}

test('x[i] selects along the first dimension', function()
  local x = m()
  eq(x[1]:tolist(), {0, 1, 2, 3})
  eq(x[3]:tolist(), {8, 9, 10, 11})
  eq(x[-1]:tolist(), {8, 9, 10, 11})
  eq(x[2][3]:item(), 6)
  raises(function() return x[4] end, 'index 4 out of range for dimension 1 of size 3')
  raises(function() return x[-4] end, 'index -4 out of range for dimension 1 of size 3')
  raises(function() return torch.tensor(1)[1] end, 'cannot index a 0-dimensional tensor (use x:item())')
end)

test('x[{...}] takes one entry per dimension', function()
  local x = m()
  eq(x[{2, 3}]:item(), 6)
  eq(x[{-1, -1}]:item(), 11)
  eq(x[{{}, 2}]:tolist(), {1, 5, 9})
  eq(x[{{2, 3}, {}}]:tolist(), {{4, 5, 6, 7}, {8, 9, 10, 11}})
  eq(x[{{1, -1, 2}, {2}}]:tolist(), {{1}, {9}})
  eq(x[{1, {2, -2}}]:tolist(), {1, 2})
  eq(x[{{3, 2}}]:size(), {0, 4})
  raises(function() return x[{1, 2, 3}] end, 'too many indices for a 2-dimensional tensor (got 3)')
  raises(function() return x[{1, 'a'}] end, 'bad index entry 2 (number or table expected, got string)')
  raises(function() return x[{{1, 5}}] end, 'index 5 out of range for dimension 1 of size 3')
end)

test('indexing returns views', function()
  local x = m()
  local row = x[2]
  row:fill_(0)
  eq(x:sum():item(), 66 - 22)
end)

test('assignment copies into the view', function()
  local x = torch.zeros(3, 4)
  x[1] = 5
  x[{2, 3}] = 7
  x[{3, {}}] = torch.tensor({1, 2, 3, 4})
  x[{{}, 4}] = torch.tensor({9, 9, 9})
  eq(x:tolist(), {{5, 5, 5, 9}, {0, 0, 7, 9}, {1, 2, 3, 9}})
  local y = torch.zeros(4)
  y[y:eq(0)] = 2
  eq(y:tolist(), {2, 2, 2, 2})
  raises(function() x[{1, 1}] = 'a' end, 'bad value for tensor assignment (number or Tensor expected, got string)')
end)

test('bool masks and index tensors', function()
  local x = torch.tensor({5, 6, 7, 8})
  eq(x[x:gt(6)]:tolist(), {7, 8})
  eq(x[torch.tensor({4, 1}, {dtype = 'int64'})]:tolist(), {8, 5})
  raises(function() return x[torch.tensor({0}, {dtype = 'int64'})] end, 'index 0 out of range of size 4; indices start at 1)')
  -- as PyTorch's advanced indexing: an index or mask on the CPU serves a
  -- tensor on any device (index_select and gather want theirs on its device)
  local on_cpu = torch.tensor({4, 1}, {dtype = 'int64', device = 'cpu'})
  eq(x[on_cpu]:tolist(), {8, 5})
  eq(x[x:gt(6):to('cpu')]:tolist(), {7, 8})
  local y = x:clone()
  y[on_cpu] = 0
  y[torch.tensor({false, true, false, false}, {device = 'cpu'})] = -1
  eq(y:tolist(), {0, -1, 7, 0})
  if x.device ~= 'cpu' then
    H.raises_part(function() x:index_select(1, on_cpu) end, 'Expected all tensors to be on the same device, but got index is on cpu, different from other tensors on ' .. x.device)
  end
end)

test('index_select, gather, scatter use 1-based indices', function()
  local x = m()
  local idx = torch.tensor({3, 1}, {dtype = 'int64'})
  eq(x:index_select(1, idx):tolist(), {{8, 9, 10, 11}, {0, 1, 2, 3}})
  eq(x:index_select(2, idx):tolist(), {{2, 0}, {6, 4}, {10, 8}})
  local g = torch.tensor({{4, 1}, {2, 2}, {1, 3}}, {dtype = 'int64'})
  eq(x:gather(2, g):tolist(), {{3, 0}, {5, 5}, {8, 10}})
  local z = torch.zeros(2, 3)
  local s = z:scatter(2, torch.tensor({{3}, {1}}, {dtype = 'int64'}), 1)
  eq(s:tolist(), {{0, 0, 1}, {1, 0, 0}})
  local sa = torch.zeros(3):scatter_add(1, torch.tensor({1, 1, 3}, {dtype = 'int64'}), torch.tensor({1, 2, 3}))
  eq(sa:tolist(), {3, 0, 3})
  raises(function() x:index_select(1, torch.tensor({1.5})) end, "bad argument #2 to 'index_select' (index tensor must have an integer dtype, got float32)")
  raises(function() x:index_select(3, idx) end, "bad argument #1 to 'index_select' (dimension 3 out of range for a 2-dimensional tensor, expected 1..2 or -2..-1)")
end)

test('argmax, max(dim), topk and sort return 1-based indices', function()
  local x = torch.tensor({{1, 9, 3}, {7, 2, 8}})
  eq(x:argmax():item(), 2)
  eq(x:argmax(2):tolist(), {2, 3})
  eq(x:argmin(1):tolist(), {1, 2, 1})
  local v, i = x:max(2)
  eq(v:tolist(), {9, 8})
  eq(i:tolist(), {2, 3})
  local v2, i2 = x:min(1, true)
  eq(v2:size(), {1, 3})
  eq(i2:tolist(), {{1, 2, 1}})
  local tv, ti = torch.tensor({4, 1, 6, 3}):topk(2)
  eq(tv:tolist(), {6, 4})
  eq(ti:tolist(), {3, 1})
  local sv, si = torch.tensor({4, 1, 6}):sort()
  eq(sv:tolist(), {1, 4, 6})
  eq(si:tolist(), {2, 1, 3})
  -- the returned indices index the tensor back
  eq(x[1][x:argmax(2)[1]]:item(), 9)
end)

test('masked_fill, where, tril, triu', function()
  local x = torch.ones(3, 3)
  eq(x:tril():sum():item(), 6)
  eq(x:triu(1):sum():item(), 3)
  local causal = torch.ones(3, 3):triu(1):bool()
  eq(torch.zeros(3, 3):masked_fill(causal, -1):tolist(), {{0, -1, -1}, {0, 0, -1}, {0, 0, 0}})
  local c = torch.tensor({1, -2, 3})
  eq(torch.where(c:gt(0), c, 0):tolist(), {1, 0, 3})
  eq(c:where(c:gt(0), torch.zeros(3)):tolist(), {1, 0, 3})
  raises(function() x:masked_fill(torch.ones(3, 3), 0) end, "bad argument #1 to 'masked_fill' (mask must be a bool tensor, got float32)")
end)

-- lua_api under UBSan (seed 55): an index entry past 2^63 (x[{2^64}]) was
-- converted to int64 regardless.
test('an index entry past 2^63 is an error', function()
  raises(function() return torch.zeros(2, 2)[{2 ^ 64}] end, 'bad index entry 1 (integer expected, got 18446744073709551616.000000)')
end)

H.done()
