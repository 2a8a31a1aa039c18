-- nn.call_child: how a container runs a child, the one place an error inside
-- a model gains where it happened, and where a model run again from inside
-- its own forward is stopped.
local nn = require('anatomy.nn')

-- Calls child `name` of `self` on x; an error is re-raised with where it
-- happened, the position kept in front: "script.lua:12: in block 2
-- (nn.Linear) of nn.Sequential: ..." (torch/nn's Container does the same).
-- The block's own forward position when it is the user's code ("forward at
-- my_model.lua:30"): an error from a tail call in it (`return h:matmul(W)`)
-- carries the caller's line, so the prefix says where the block is.
local function forward_position(child)
  local f = child.forward
  if type(f) ~= 'function' then return '' end
  local info = debug.getinfo(f, 'S')
  local library = debug.getregistry()['anatomy.lua_dir']
  if info.what ~= 'Lua' or (library and info.source:sub(2, #library + 1) == library) then return '' end
  return (', forward at %s:%d'):format(info.short_src, info.linedefined)
end

-- A model run again inside its own forward (a hook calling its model) stops at 200 nested children, before
-- LuaJIT's own stack overflow, which unwound through hundreds of native frames has crashed it on occasion.
-- Counted per coroutine (each has its own stack), in a table with weak keys: a coroutine abandoned while
-- suspended inside a forward takes its count with it rather than leaving it on everyone's.
local MAX_NESTING = 200
local nesting = setmetatable({}, {__mode = 'k'})
local MAIN = {}  -- the main thread's key (coroutine.running() is nil there in Lua 5.1)

-- nn.call_child(self, name, child, x, ...) -> child(x, ...), an error from it prefixed with where it
-- happened ('in block 2 (nn.Linear) of nn.Sequential: ...'), as torch/nn's containers do
function nn.call_child(self, name, child, x, ...)
  local co = coroutine.running() or MAIN
  local depth = nesting[co] or 0
  if depth >= MAX_NESTING then error('stack overflow', 0) end
  nesting[co] = depth + 1
  local ok, y = pcall(child._call, child, x, ...)
  nesting[co] = depth > 0 and depth or nil
  if not ok then
    local msg = tostring(y)
    local where, rest = msg:match('^([^\n]-:%d+: )(.*)$')
    rest = rest or msg
    local prefix = ('in %s (%s%s) of %s: '):format(tonumber(name) and 'block ' .. name or "'" .. name .. "'",
      nn.typename(child), forward_position(child), nn.typename(self))
    -- a recursion (a hook that runs the model again) passes here once a
    -- level: the place is said once, and what the overflow means
    if rest:find(prefix, 1, true) then error(msg, 0) end
    if rest:match('stack overflow$') then
      rest = rest .. ' (the model was called again from inside its own forward, by the block or by a hook on it)'
    end
    error((where or '') .. prefix .. rest, 0)
  end
  return y
end
