-- anatomy.torch: the `torch` table. The native half (anatomy.core) holds
-- tensors and kernels; this file completes it in Lua. Every library file
-- takes it with `local torch = require('anatomy.torch')`; scripts and the
-- REPL see it as the global `torch` (anatomy/init.lua). The natives meant for
-- the library alone are not on it: they are anatomy.torch.native.
local native = require('anatomy.torch.native')
local torch = require('anatomy.core')

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
function torch.__config__.show() return native.show_config() end
torch.backends = {cpu = {}}
-- torch.backends.cpu.get_cpu_capability() -> the ATen CPU kernels in use: 'AVX2', 'AVX512', 'DEFAULT'
-- ('unknown' where LibTorch's build description does not say)
function torch.backends.cpu.get_cpu_capability()
  return native.show_config():match('CPU capability usage: (%w+)') or 'unknown'
end

-- The CPU's memory: freed buffers of 1 MiB and more are kept in a pool and
-- reused (new memory must first be cleared by the kernel, which costs as much
-- as a matmul over it), up to a limit: $ANATOMY_CPU_CACHE_LIMIT, default a
-- quarter of the machine's memory, at most 4 GiB. The pool gives its
-- buffers back on its own where a new allocation would leave the machine short.
torch.cpu = {}
-- torch.cpu.memory_stats() -> {pooled_bytes, pooled_blocks, limit, reused, fresh}: what the pool holds
-- now, its limit, and how many large requests it served and how many needed new memory
function torch.cpu.memory_stats() return native.cpu_pool() end
-- torch.cpu.empty_cache() -> bytes: frees every buffer the pool holds (as torch.cuda.empty_cache)
function torch.cpu.empty_cache() return native.cpu_pool_empty() end
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
  native.cpu_pool_set_limit(n)
end

-- dtype names, so that torch.float32 reads as in PyTorch
for _, name in ipairs{'float32', 'float64', 'float16', 'bfloat16', 'int64', 'int32', 'int16', 'int8', 'uint8', 'bool'} do
  torch[name] = name
end
torch.float, torch.double, torch.half, torch.long, torch.int = 'float32', 'float64', 'float16', 'int64', 'int32'

-- torch.manual_seed(n): seeds LibTorch's generators and math.random alike.
function torch.manual_seed(seed)
  native.manual_seed(seed)
  math.randomseed(seed)
end

-- The one-line description printed by the REPL and --version.
function torch.banner()
  local n = torch.get_num_threads()
  return string.format('anatomy %s  (%s, LibTorch %s, %s, %d thread%s)',
    torch.version.anatomy, jit and jit.version or _VERSION,
    torch.libtorch_version .. (torch.version.cuda and ', CUDA ' .. torch.version.cuda or ''), torch.device(), n, n == 1 and '' or 's')
end

-- torch.load_npz(path) -> {name = tensor, ...}, {names in archive order}: NumPy's .npz (np.savez,
-- np.savez_compressed), each member 'name.npy' as tensor `name` on the default device. Plain arrays
-- only (f2, f4, f8, i1-i8, u1, b1; '>' byte order swapped, Fortran order transposed); object arrays
-- (pickles), structured, string and complex dtypes, bad or duplicate member names, and any member
-- whose bytes disagree with its shape are errors naming the file, the member and what is wrong
function torch.load_npz(path)
  local tensors, names = native.load_npz(path)
  return tensors, names
end

-- torch.save_npz(path, {name = tensor, ...}[, {compressed = false}]): what np.savez (compressed:
-- np.savez_compressed) writes, members in name order, written to a temporary file renamed into
-- place (never a partial file). bfloat16 has no numpy dtype and is refused
function torch.save_npz(path, tensors, opts)
  if opts ~= nil and type(opts) ~= 'table' then
    error(("torch.save_npz: options must be a table, got a %s"):format(type(opts)), 2)
  end
  for k, v in pairs(opts or {}) do
    if k ~= 'compressed' then error(("torch.save_npz: unknown option '%s' (the one option is 'compressed')"):format(tostring(k)), 2) end
    if type(v) ~= 'boolean' then error(("torch.save_npz: option 'compressed' must be true or false, got %s"):format(tostring(v)), 2) end
  end
  native.save_npz(path, tensors, opts and opts.compressed or false)
end

require 'anatomy.torch.tensor'
torch.config = require 'anatomy.torch.config'

return torch
