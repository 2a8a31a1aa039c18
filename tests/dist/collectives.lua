-- The collectives across real ranks (run by tests/dist/test_data_parallel.lua
-- under `anatomy --nproc 3`): their values on every rank, and calls that
-- differ across ranks (shape, dtype, op, which collective), each an error
-- raised on every rank that names what each rank passed, after which the
-- world still works. Every rank prints "rank R: N passed, M failed".
local rank, world = dist.rank(), dist.world_size()
local passed, failed = 0, 0
local function check(name, ok, detail)
  if ok then passed = passed + 1 else
    failed = failed + 1
    print(('rank %d FAIL %s: %s'):format(rank, name, tostring(detail)))
  end
end
local function list_eq(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end
local function sum_of_ranks(f) local s = 0 for r = 0, world - 1 do s = s + f(r) end return s end

-- values: rank r holds r + 1 and 10 (r + 1)
local t = dist.all_reduce(torch.tensor({rank + 1, 10 * (rank + 1)}))
local want = {sum_of_ranks(function(r) return r + 1 end), sum_of_ranks(function(r) return 10 * (r + 1) end)}
check('all_reduce sum', list_eq(t:tolist(), want), t)
t = dist.all_reduce(torch.tensor({rank + 1.0}), {op = 'avg'})
check('all_reduce avg', math.abs(t:item() - want[1] / world) < 1e-6, t)
check('all_reduce max', dist.all_reduce(torch.tensor({rank}), {op = 'max'}):item() == world - 1)
check('all_reduce min', dist.all_reduce(torch.tensor({rank}), {op = 'min'}):item() == 0)
check('all_reduce product', dist.all_reduce(torch.tensor({rank + 2}), {op = 'product'}):item()
  == (function() local p = 1 for r = 0, world - 1 do p = p * (r + 2) end return p end)())
local ints = dist.all_reduce(torch.tensor({rank, 2 ^ 40}, {dtype = 'int64'}))
check('all_reduce of int64, exact', ints.dtype == 'int64' and list_eq(ints:tolist(), {sum_of_ranks(function(r) return r end), world * 2 ^ 40}), ints)
-- a view that is not contiguous: the result lands in the viewed tensor
local base = torch.arange(1, 7):view(2, 3) * (rank + 1)
local view = base:t()
dist.all_reduce(view)
check('all_reduce of a non-contiguous view writes through it', list_eq(base:view(-1):tolist(),
  {1 * want[1], 2 * want[1], 3 * want[1], 4 * want[1], 5 * want[1], 6 * want[1]}), base)
local g = dist.all_gather(torch.tensor({rank, -rank}))
check('all_gather: one tensor a rank, in rank order', #g == world and g[world]:tolist()[1] == world - 1
  and g[world]:tolist()[2] == -(world - 1) and g[1]:tolist()[1] == 0, #g)
local b = dist.broadcast(torch.tensor({rank, rank}), world - 1)
check('broadcast from the last rank', list_eq(b:tolist(), {world - 1, world - 1}), b)
dist.barrier()
check('barrier', true)

-- calls that differ across ranks: the same error on every rank, naming each rank's call
local function disagree(name, fn, fragments)
  local ok, err = pcall(fn)
  local good = not ok and tostring(err):match('the ranks disagree on the collective') ~= nil
  for _, f in ipairs(fragments) do good = good and tostring(err):find(f, 1, true) ~= nil end
  check(name, good, err)
  -- the world goes on: the next collective is in step on every rank
  check(name .. ', then the world goes on', dist.all_reduce(torch.ones(1)):item() == world)
end
disagree('shapes differ', function() dist.all_reduce(torch.ones(rank == 0 and 4 or 6)) end,
  {'dist.all_reduce on rank ' .. rank, 'rank 0: all_reduce of float32 [4] op sum', 'rank 1: all_reduce of float32 [6] op sum'})
disagree('dtypes differ', function() dist.all_reduce(torch.ones(3, {dtype = rank == 0 and 'float32' or 'float64'})) end,
  {'rank 0: all_reduce of float32 [3]', 'rank 1: all_reduce of float64 [3]'})
disagree('ops differ', function() dist.all_reduce(torch.ones(3), {op = rank == 0 and 'sum' or 'max'}) end,
  {'op sum', 'op max'})
disagree('all_gather of different shapes', function() dist.all_gather(torch.ones(rank + 1, 2)) end,
  {'rank 0: all_gather of float32 [1, 2]', 'rank 2: all_gather of float32 [3, 2]'})
disagree('broadcast from different sources', function() dist.broadcast(torch.ones(2), rank == 0 and 0 or 1) end,
  {'from rank 0', 'from rank 1'})
disagree('different collectives', function()
  if rank == 0 then dist.barrier() else dist.all_gather(torch.ones(2)) end
end, {'rank 0: barrier', 'rank 1: all_gather of float32 [2]'})

print(('rank %d: %d passed, %d failed'):format(rank, passed, failed))
