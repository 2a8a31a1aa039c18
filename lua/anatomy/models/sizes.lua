-- sizes: what a config.json implies, checked before anything is built. A
-- config that says n_layer = 10^9 over a small checkpoint is refused from its
-- sizes alone, in milliseconds, where building it ran minutes before the
-- allocator gave up.
local native = require('anatomy.torch.native')
local format = require('anatomy.render.format')
local sizes = {}

-- A count of parameters as errors write it: '1,234,567' (scientific past 10^14).
local function count_text(n)
  if n < 1e14 then return format.count(n) end
  return ('%.3e'):format(n)
end

-- Bytes as errors write them: '512 bytes', '1.5 GiB', '3.2 TiB'.
local function bytes_text(b)
  local units, i = {'bytes', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB', 'EiB'}, 1
  while b >= 1024 and i < #units do b, i = b / 1024, i + 1 end
  return i == 1 and ('%d bytes'):format(b) or ('%.1f %s'):format(b, units[i])
end

-- A config that says n_layer = 10^9 over a small checkpoint is refused from
-- its sizes alone, in milliseconds, where building it ran minutes before the
-- allocator gave up. The count is the family's (F.parameters), in bytes of
-- the dtype the parameters are read in (float32 unless given); the memory is what the memory guard counts
-- (native.available_memory). The weights may hold more than the config
-- implies (buffers, a tied head saved anyway) or a little less (an untied
-- head left out, named later as the missing tensor): only a config implying
-- more than 1.5 times their elements is refused.

-- pretrained.check_size(F, s, config, source, where[, files, weights, dtype]) -> the
-- parameter count s implies; an error naming source, the keys, the count and
-- the memory left when it needs more memory than is left or, given the
-- weights (files: name -> its safe_open file; weights: how to name them),
-- more than 1.5 times the elements their headers hold. dtype: what the
-- parameters are read in ('float32', 'bfloat16', 'float16'; float32 if nil)
function sizes.check_size(F, s, config, source, where, files, weights, dtype)
  local n = F.parameters(s)
  dtype = dtype or 'float32'
  local bytes = (dtype == 'float32' and 4 or 2) * n
  local keys = {}
  for _, k in ipairs(F.size_keys) do
    if type(config[k]) == 'number' then keys[#keys + 1] = ('%s = %s'):format(k, tostring(config[k])) end
  end
  local implies = ('%s implies %s parameters, %s in %s (%s)'):format(source, count_text(n), bytes_text(bytes), dtype,
    table.concat(keys, ', '))
  local available = native.available_memory()
  local memory = available > 0 and ('this machine has %s of memory left'):format(bytes_text(available))
    or 'the memory left cannot be told here'
  if files then
    local stored = 0
    for name, f in pairs(files) do
      local k = 1
      for _, d in ipairs(f:shape(name)) do k = k * d end
      stored = stored + k
    end
    if n > 1.5 * stored then
      error(('%s: %s, but %s hold %s: the config does not describe these weights (%s)'):format(
        where, implies, weights, count_text(stored), memory), 0)
    end
  end
  if available > 0 and bytes > available then
    error(('%s: %s, more than the %s of memory this machine has left (RAM available and free swap, within a cgroup\'s limit)'):format(
      where, implies, bytes_text(available)), 0)
  end
  return n
end

return sizes
