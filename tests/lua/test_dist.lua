-- dist in one process: the API outside a world, a world of one (a real
-- TCPStore and Gloo group), and its errors. Several ranks:
-- tests/dist/test_data_parallel.lua.
local H = require('harness')

local raises = H.raises_part  -- the message contains the fragment

H.test('outside a world: rank 0 of 1, and collectives say how to start one', function()
  H.eq(dist.is_available(), true)
  H.eq(dist.is_initialized(), false)
  H.eq(dist.rank(), 0)
  H.eq(dist.world_size(), 1)
  H.eq(dist.is_main(), true)
  raises(function() dist.all_reduce(torch.ones(2)) end, 'no process group: run under `anatomy --nproc N`')
  raises(function() dist.barrier() end, 'dist.barrier: no process group')
  raises(function() dist.init_process_group() end, 'WORLD_SIZE is not set')
  H.eq(torch.distributed, dist)
end)

H.test('init_process_group checks its arguments', function()
  raises(function() dist.init_process_group{rank = 0} end, 'world_size must be a number, got nil')
  raises(function() dist.init_process_group{rank = 0, world_size = 1, backend = 'mpi'} end, "unknown backend 'mpi'")
  raises(function() dist.init_process_group{rank = 0, world_size = 1, port = 5} end, 'port')
  raises(function() dist.init_process_group{rank = 2, world_size = 2, master_port = 29999} end, 'rank 2 is outside 0..1')
  raises(function() dist.init_process_group{rank = 0, world_size = 2} end, 'needs a port')
  raises(function() dist.init_process_group{rank = 0, world_size = 1, master_port = 70000} end, 'master_port must be in 1..65535')
  H.eq(dist.is_initialized(), false)
end)

-- Gloo's collectives take CPU tensors: these tests make theirs there, whatever
-- the default device (accel, the test device, has no collective backend).
local function on_cpu(fn)
  return function()
    local was = torch.device()
    torch.set_default_device('cpu')
    local ok, err = pcall(fn)
    torch.set_default_device(was)
    if not ok then error(err, 0) end
  end
end

H.test('a world of one: collectives are the identity, in place', on_cpu(function()
  dist.init_process_group{rank = 0, world_size = 1, timeout = 10}
  H.eq(dist.is_initialized(), true)
  H.eq(dist.timeout(), 10)
  local t = torch.tensor({1.5, -2, 3})
  H.eq(dist.all_reduce(t), t, 'returns its argument')
  H.eq(t:tolist(), {1.5, -2, 3})
  for _, op in ipairs{'sum', 'avg', 'max', 'min', 'product'} do
    H.eq(dist.all_reduce(torch.tensor({4, 5}), {op = op}):tolist(), {4, 5}, op)
  end
  H.eq(dist.all_reduce(torch.tensor({4, 5}), 'avg'):tolist(), {4, 5})
  local g = dist.all_gather(torch.tensor({7, 8}))
  H.eq(#g, 1)
  H.eq(g[1]:tolist(), {7, 8})
  H.eq(dist.broadcast(torch.tensor({1, 2}), 0):tolist(), {1, 2})
  dist.barrier()
  -- a view that is not contiguous is reduced through a copy and written back
  local base = torch.arange(1, 7):float():view(2, 3)
  local v = base:t()
  dist.all_reduce(v)
  H.eq(base:tolist(), {{1, 2, 3}, {4, 5, 6}})
  -- a parameter (requires_grad) is reduced without autograd complaining
  local p = torch.ones(3, {requires_grad = true})
  dist.all_reduce(p, {op = 'avg'})
  H.eq(p:tolist(), {1, 1, 1})
  H.eq(p.requires_grad, true)
end))

H.test('collectives name their argument mistakes', on_cpu(function()
  raises(function() dist.all_reduce(nil) end, 'dist.all_reduce: expected a Tensor, got nil')
  raises(function() dist.all_reduce({1, 2}) end, 'expected a Tensor, got table')
  raises(function() dist.all_reduce(torch.ones(2), {op = 'mean_of_squares'}) end, "unknown op 'mean_of_squares'")
  raises(function() dist.all_reduce(torch.ones(2), {opp = 'sum'}) end, 'opp')
  raises(function() dist.all_reduce(torch.tensor({1, 2}, {dtype = 'int64'}), {op = 'avg'}) end,
    "op 'avg' needs a floating-point tensor, got Long")
  raises(function() dist.broadcast(torch.ones(2), 1) end, 'src must be a rank in 0..0, got 1')
  raises(function() dist.broadcast(torch.ones(2), 'zero') end, 'src must be a rank (a number), got string')
  raises(function() dist.all_gather('x') end, 'dist.all_gather: expected a Tensor, got string')
  raises(function() dist.init_process_group{rank = 0, world_size = 1} end, 'already rank 0 of 1')
  -- the world survives its errors
  H.eq(dist.all_reduce(torch.ones(2)):tolist(), {1, 1})
end))

H.test('a tensor on a device without a collective backend is refused, naming both backends', function()
  if not dist.is_initialized() then H.skip('no world of one: the test before it failed') end
  local ok = pcall(torch.device, 'accel')
  if not ok then H.skip('this LibTorch has no accel device') end
  raises(function() dist.all_reduce(torch.ones(2, {device = 'accel'})) end,
    'dist.all_reduce: tensors on accel:0 have no collective backend (cpu: Gloo, cuda: NCCL)')
end)

H.test('train.fit in a world of one trains as one process does', function()
  local c = data.from_string(('to be or not to be, that is the question. '):rep(30))
  local function run()
    torch.manual_seed(2)
    local m = models.gpt{vocab = c.vocab_size, dim = 16, heads = 2, layers = 1, seq = 16, ffn = 32}
    return train.fit(m, c, {steps = 5, batch = 4, seq = 16, seed = 3, quiet = true, eval_every = 10 ^ 9})
  end
  local inside = run()
  dist.destroy_process_group()
  H.eq(dist.is_initialized(), false)
  local outside = run()
  H.eq(inside.world_size, 1)
  for i = 1, 5 do H.eq(inside.train[i], outside.train[i], 'step ' .. i) end
  raises(function() train.fit(models.gpt{vocab = c.vocab_size, dim = 16, heads = 2, layers = 1, seq = 16, ffn = 32}, c,
    {steps = 1, bucket_mb = -1, quiet = true}) end, 'bucket_mb must be a positive number of MiB, got -1')
end)

H.test('on a GPU, CUDA tensors go through NCCL (a world of one)', function()
  if not torch.cuda.is_available() then
    H.skip(torch.version.cuda and ('no GPU is visible (CUDA ' .. torch.version.cuda .. ' build)')
      or 'this LibTorch has no CUDA: NCCL is compiled in the CUDA build only')
  end
  dist.init_process_group{rank = 0, world_size = 1, timeout = 30}
  local t = torch.tensor({1, 2, 3}, {device = 'cuda'})
  H.eq(dist.all_reduce(t, {op = 'sum'}):tolist(), {1, 2, 3})
  H.eq(dist.all_reduce(t, {op = 'avg'}):tolist(), {1, 2, 3})
  H.eq(dist.broadcast(t, 0):tolist(), {1, 2, 3})
  local g = dist.all_gather(t)
  H.eq(g[1].device, t.device)
  dist.destroy_process_group()
end)

os.exit(H.done())
