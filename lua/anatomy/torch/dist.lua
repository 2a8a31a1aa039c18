-- dist: data-parallel training across processes, on LibTorch's c10d (Gloo
-- for CPU tensors, NCCL for CUDA tensors in the CUDA build), with
-- torch.distributed's names. Ranks count from 0, as the launchers' RANK does.
--
-- `anatomy --nproc N script.lua` starts N ranks on this machine; under
-- torchrun or a SLURM script that sets MASTER_ADDR, MASTER_PORT, RANK,
-- WORLD_SIZE (and LOCAL_RANK), `anatomy script.lua` joins the world at
-- start-up. train.fit then trains data-parallel by itself.
local torch = require('anatomy.torch')
local options = require('anatomy.torch.options')
local native = require('anatomy.torch.native').dist
local dist = {}

local function check_tensor(fn, t)
  if not torch.is_tensor(t) then
    error(('dist.%s: expected a Tensor, got %s'):format(fn, type(t)), 3)
  end
end

--- dist.is_available() -> true: this build has c10d (Gloo; NCCL with CUDA).
function dist.is_available() return true end

--- dist.is_initialized() -> whether this process is a rank of a world.
function dist.is_initialized() return native.is_initialized() end
--- dist.rank() -> this process's rank, 0..world_size-1 (0 outside a world).
function dist.rank() return native.rank() end
--- dist.world_size() -> the number of ranks (1 outside a world).
function dist.world_size() return native.world_size() end
--- dist.local_rank() -> the rank among those on this machine (LOCAL_RANK): the GPU it uses.
function dist.local_rank() return native.local_rank() end
--- dist.timeout() -> seconds a collective waits for the other ranks (ANATOMY_DIST_TIMEOUT, default 60).
function dist.timeout() return native.timeout() end
--- dist.barrier(): waits until every rank reaches it.
function dist.barrier() return native.barrier() end
--- dist.destroy_process_group(): leaves the world.
function dist.destroy_process_group() return native.destroy_process_group() end

--- dist.init_process_group{rank, world_size, master_addr = '127.0.0.1',
--- master_port, timeout = 60, backend} joins a world through a TCPStore at
--- master_addr:master_port (rank 0 hosts it). With no table, the
--- environment's MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE and LOCAL_RANK.
--- backend: 'gloo' (CPU tensors) or 'nccl' (CUDA tensors); both are made as
--- the tensors need them, so it is only checked.
function dist.init_process_group(opts)
  if opts == nil then
    if not native._init_from_environment() then
      error('dist.init_process_group: WORLD_SIZE is not set; pass {rank = , world_size = , master_port = } or run under `anatomy --nproc N`', 2)
    end
    return
  end
  opts = options.check(opts,
    {'rank', 'world_size', 'master_addr', 'master_port', 'local_rank', 'timeout', 'backend'}, 'dist.init_process_group', 2)
  if opts.backend ~= nil and opts.backend ~= 'gloo' and opts.backend ~= 'nccl' then
    error(("dist.init_process_group: unknown backend '%s', expected 'gloo' or 'nccl'"):format(tostring(opts.backend)), 2)
  end
  for _, key in ipairs{'rank', 'world_size'} do
    if type(opts[key]) ~= 'number' then
      error(('dist.init_process_group: %s must be a number, got %s'):format(key, type(opts[key])), 2)
    end
  end
  native._init{rank = opts.rank, world_size = opts.world_size, master_addr = opts.master_addr,
    master_port = opts.master_port, local_rank = opts.local_rank, timeout = opts.timeout}
end

local ops = {sum = true, avg = true, mean = true, max = true, min = true, product = true}

--- dist.all_reduce(t, {op = 'sum'|'avg'|'max'|'min'|'product'}) -> t: every
--- rank's t combined, in place on every rank (default op: sum).
function dist.all_reduce(t, opts)
  check_tensor('all_reduce', t)
  local op = 'sum'
  if type(opts) == 'string' then
    op = opts
  elseif opts ~= nil then
    opts = options.check(opts, {'op'}, 'dist.all_reduce', 2)
    op = opts.op or 'sum'
  end
  if not ops[op] then
    error(("dist.all_reduce: unknown op '%s', expected 'sum', 'avg', 'max', 'min' or 'product'"):format(tostring(op)), 2)
  end
  return native.all_reduce(t, op)
end

--- dist.broadcast(t, src) -> t: rank src's t, copied into t on every rank.
function dist.broadcast(t, src)
  check_tensor('broadcast', t)
  if src ~= nil and type(src) ~= 'number' then
    error(('dist.broadcast: src must be a rank (a number), got %s'):format(type(src)), 2)
  end
  return native.broadcast(t, src or 0)
end

--- dist.all_gather(t) -> {t of rank 0, t of rank 1, ...} (one shape and dtype on every rank).
function dist.all_gather(t)
  check_tensor('all_gather', t)
  return native.all_gather(t)
end

--- dist.is_main() -> true on rank 0 (and outside a world): the rank that prints and writes files.
function dist.is_main() return native.rank() == 0 end

return dist
