-- anatomy.torch.native: the natives the library builds on and scripts do not
-- call: file system primitives (lstat_kind, realpath, mkdir, lock, symlink,
-- write_atomic ...), the HTTP client, the clock (now), the CPU pool, the
-- native halves of nn, data, optim, exact and dist. anatomy.core registers
-- them on its table with a leading underscore; the first require takes them
-- off it, so that `torch` holds only what PyTorch's users expect, and keeps
-- them here without the underscore (core's _native is native.blocks).
local core = require('anatomy.core')

local renamed = {native = 'blocks'}
local native = {}
local taken = {}
for k, v in pairs(core) do
  local name = type(k) == 'string' and k:match('^_(%a[%w_]*)$')
  if name then
    native[renamed[name] or name] = v
    taken[#taken + 1] = k
  end
end
for _, k in ipairs(taken) do core[k] = nil end
return native
