-- anatomy: the `torch` table seen by scripts and the REPL. The native half
-- (anatomy.core) holds tensors and kernels; this file completes it in Lua.
local torch = require('anatomy.core')
_G.torch = torch  -- the rest of the library refers to the global, as scripts do

-- Versions, with PyTorch's names: torch.__version__ is LibTorch's;
-- torch.version.cuda the CUDA it was built with (nil without); torch.version()
-- calls give LibTorch's too. torch.version.anatomy is this library's own.
torch.__version__ = torch.libtorch_version
torch.version = setmetatable({anatomy = '0.1.0', libtorch = torch.libtorch_version, cuda = torch.cuda._version()}, {
  __call = function() return torch.libtorch_version end,
  __tostring = function() return torch.libtorch_version end,
})

-- How LibTorch was built and which CPU kernels it runs, with PyTorch's names.
torch.__config__ = {}
-- torch.__config__.show() -> LibTorch's build description (compiler, BLAS, LAPACK, CPU capability, ...)
function torch.__config__.show() return torch._show_config() end
torch.backends = {cpu = {}}
-- torch.backends.cpu.get_cpu_capability() -> the ATen CPU kernels in use: 'AVX2', 'AVX512', 'DEFAULT'
-- ('unknown' where LibTorch's build description does not say)
function torch.backends.cpu.get_cpu_capability()
  return torch._show_config():match('CPU capability usage: (%w+)') or 'unknown'
end

-- The CPU's memory: freed buffers of 1 MiB and more are kept in a pool and
-- reused (new memory must first be cleared by the kernel, which costs as much
-- as a matmul over it), up to a limit: $ANATOMY_CPU_CACHE_LIMIT, default a
-- quarter of the machine's memory, at most 4 GiB. The pool gives its
-- buffers back on its own where a new allocation would leave the machine short.
torch.cpu = {}
-- torch.cpu.memory_stats() -> {pooled_bytes, pooled_blocks, limit, reused, fresh}: what the pool holds
-- now, its limit, and how many large requests it served and how many needed new memory
function torch.cpu.memory_stats() return torch._cpu_pool() end
-- torch.cpu.empty_cache() -> bytes: frees every buffer the pool holds (as torch.cuda.empty_cache)
function torch.cpu.empty_cache() return torch._cpu_pool_empty() end
-- torch.cpu.set_cache_limit(bytes): the most the pool keeps (0: keep nothing); frees it if it holds more.
-- bytes: a whole number, or a string as $ANATOMY_CPU_CACHE_LIMIT takes it ('512M', '2G': 1024s)
function torch.cpu.set_cache_limit(bytes)
  local n = bytes
  if type(bytes) == 'string' then
    local num, unit = bytes:match('^%s*(%d+%.?%d*)%s*([KkMmGg]?)%s*$')
    n = num and tonumber(num) * ({[''] = 1, k = 1024, m = 1024 ^ 2, g = 1024 ^ 3})[unit:lower()]
    if n then n = math.floor(n) end
  end
  if type(n) ~= 'number' or n ~= n or n < 0 or n >= 2 ^ 63 or n % 1 ~= 0 then
    error(("torch.cpu.set_cache_limit: bytes must be a whole number from 0 to 2^63 or a size such as '2G', got %s"):format(
      type(bytes) == 'number' and tostring(bytes) or type(bytes) == 'string' and ("'" .. bytes .. "'") or 'a ' .. type(bytes)), 2)
  end
  torch._cpu_pool_set_limit(n)
end

-- dtype names, so that torch.float32 reads as in PyTorch
for _, name in ipairs{'float32', 'float64', 'float16', 'bfloat16', 'int64', 'int32', 'int16', 'int8', 'uint8', 'bool'} do
  torch[name] = name
end
torch.float, torch.double, torch.half, torch.long, torch.int = 'float32', 'float64', 'float16', 'int64', 'int32'

-- torch.manual_seed(n): seeds LibTorch's generators and math.random alike.
function torch.manual_seed(seed)
  torch._manual_seed(seed)
  math.randomseed(seed)
end

-- The one-line description printed by the REPL and --version.
function torch.banner()
  local n = torch.get_num_threads()
  return string.format('anatomy %s  (%s, LibTorch %s, %s, %d thread%s)',
    torch.version.anatomy, jit and jit.version or _VERSION,
    torch.libtorch_version .. (torch.version.cuda and ', CUDA ' .. torch.version.cuda or ''), torch.device(), n, n == 1 and '' or 's')
end

require 'anatomy.torch.tensor'

-- nn, models, data, optim, train, text, probe, patching, steer, lens, weights, sae, autopsy, provenance, experiment, exact and dist are globals in scripts and the REPL, like torch.
torch.nn = require 'anatomy.nn'
nn = torch.nn
models = require 'anatomy.models'
data = require 'anatomy.data'
optim = require 'anatomy.optim'
train = require 'anatomy.train'
text = require 'anatomy.data.text'
torch.config = require 'anatomy.torch.config'
probe = require 'anatomy.probe'
patching = require 'anatomy.probe.patching'
steer = require 'anatomy.probe.steer'
lens = require 'anatomy.probe.lens'
weights = require 'anatomy.probe.weights'
sae = require 'anatomy.features'
autopsy = require 'anatomy.autopsy'
-- the global: the record (io/provenance.lua) and its text (render/provenance.lua)
provenance = {}
for k, v in pairs(require('anatomy.io.provenance')) do provenance[k] = v end
for k, v in pairs(require('anatomy.render.provenance')) do provenance[k] = v end
hub = require 'anatomy.io.hub'
experiment = require 'anatomy.experiment'
exact = require 'anatomy.exact'
help = require('anatomy.session.help').help
dist = require 'anatomy.torch.dist'
torch.distributed = dist

-- Under `anatomy --nproc N` or a launcher (torchrun, a SLURM script) that
-- sets WORLD_SIZE, this process joins the world before the script runs; on
-- a GPU, each rank takes the GPU of its LOCAL_RANK.
if os.getenv('WORLD_SIZE') and not dist.is_initialized() then
  dist.init_process_group()
  if torch.device():match('^cuda') and dist.world_size() > 1 then
    torch.set_default_device('cuda:' .. dist.local_rank())
  end
end

-- Names of native functions, for error messages where Lua's debug info has
-- none (a tail call such as `return x:matmul(y)` loses the call site's name).
do
  local names = {}
  local function record(t, prefix)
    for k, v in pairs(t) do
      if type(v) == 'function' and names[v] == nil then names[v] = prefix .. k end
    end
  end
  record(torch.Tensor, '')
  record(torch, '')
  record(torch.linalg, 'linalg.')
  record(torch.cuda, 'cuda.')
  record(torch.profiler, 'profiler.')
  record(torch._native, 'nn.')
  record(torch._data, 'data.')
  record(torch._optim, 'optim.')
  record(torch.metrics, 'metrics.')
  record(torch._exact, 'exact.')
  record(torch._dist, 'dist.')
  for _, meta in ipairs{'anatomy.Corpus', 'anatomy.Native', 'anatomy.Optimizer', 'anatomy.Rational'} do
    record(debug.getregistry()[meta].__index, '')
  end
  debug.getregistry()['anatomy.names'] = names
end

return torch
