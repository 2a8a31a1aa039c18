-- The library's folders in one order (docs/DESIGN.md, "Layers"): a file may
-- require its own folder and the folders below it, never one above, at the
-- top of a file or inside a function. Every `require('anatomy.…')` of every
-- file under lua/anatomy/ is read and checked. A require that must run
-- upwards for a while is listed below by file and module, with why: a new
-- one fails the test, and so does an entry that is gone (the list only
-- shrinks). It is empty.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq = H.test, H.eq
local fs = require('anatomy.io.fs')

-- bottom to top; init.lua (the globals) stands above every folder
local order = {'torch', 'io', 'render', 'nn', 'optim', 'data', 'models', 'probe', 'train', 'features', 'autopsy',
  'experiment', 'exact', 'session'}

-- the upward requires still to be removed: file -> {module = why it is there}
local known_upward = {
}

local rank = {}
for i, folder in ipairs(order) do rank[folder] = i end

local root = (arg[0]:match('^(.*)/') or '.') .. '/../../lua/anatomy'

-- every .lua file below dir, as 'folder/file.lua' (or 'init.lua' at the top)
local function files(dir, prefix, out)
  out = out or {}
  for _, name in ipairs(fs.list(dir)) do
    local path, rel = dir .. '/' .. name, prefix and (prefix .. '/' .. name) or name
    if fs.is_dir(path) then files(path, rel, out)
    elseif name:match('%.lua$') then out[#out + 1] = rel end
  end
  return out
end

-- the folder a module name lives in ('anatomy.probe.cache' -> 'probe'; the
-- top-level 'anatomy' and natives: nil)
local function folder_of(module)
  return module:match('^anatomy%.([%w_]+)')
end

-- violations(sources) -> {{file, module}, ...}: the requires of each
-- {file = text} that run upwards
local function violations(sources)
  local out = {}
  for file, text in pairs(sources) do
    local from = file:match('^([%w_]+)/')
    if from and rank[from] then
      for module in text:gmatch("require%s*%(?%s*['\"](anatomy[%w_.]*)['\"]") do
        local to = folder_of(module)
        if to and rank[to] and rank[to] > rank[from] then out[#out + 1] = {file, module} end
      end
    end
  end
  table.sort(out, function(a, b) return a[1] .. a[2] < b[1] .. b[2] end)
  return out
end

local sources = {}
for _, f in ipairs(files(root)) do sources[f] = fs.read(root .. '/' .. f) end

test('every folder of lua/anatomy/ has its place in the order', function()
  for _, name in ipairs(fs.list(root)) do
    if fs.is_dir(root .. '/' .. name) then eq(rank[name] ~= nil, true, 'the order places ' .. name) end
  end
  eq(#files(root) > 100, true, 'the files are read')
end)

test('no require runs upwards but the listed ones, and each listed one is still there', function()
  local found, new = {}, {}
  for _, v in ipairs(violations(sources)) do
    found[v[1] .. ' ' .. v[2]] = true
    if not (known_upward[v[1]] and known_upward[v[1]][v[2]]) then new[#new + 1] = v[1] .. ' requires ' .. v[2] end
  end
  eq(table.concat(new, '; '), '', 'requires against the order (docs/DESIGN.md, "Layers")')
  local gone = {}
  for file, modules in pairs(known_upward) do
    for module in pairs(modules) do
      if not found[file .. ' ' .. module] then gone[#gone + 1] = file .. ' ' .. module end
    end
  end
  table.sort(gone)
  eq(table.concat(gone, '; '), '', 'listed upward requires that are gone: take them off the list')
end)

test('a planted upward require fails, at the top of a file and inside a function', function()
  local planted = {
    ['nn/Planted.lua'] = "local run = require('anatomy.autopsy.run')\n",
    ['io/planted.lua'] = "local function f()\n  return require 'anatomy.probe'\nend\n",
    ['probe/fine.lua'] = "local nn = require('anatomy.nn')\nlocal points = require('anatomy.probe.points')\n",
  }
  local v = violations(planted)
  eq(#v, 2, 'two upward requires found')
  eq(v[1][1] .. ' ' .. v[1][2], 'io/planted.lua anatomy.probe')
  eq(v[2][1] .. ' ' .. v[2][2], 'nn/Planted.lua anatomy.autopsy.run')
end)

-- The globals a chunk reads or writes, from its bytecode and its functions'
-- (LuaJIT's GGET and GSET name a constant string): exact, where a text
-- search would trip on locals, fields and strings of the same name.
local jutil = require('jit.util')
local band, shr = bit.band, bit.rshift
local GGET = band(jutil.funcbc(loadstring('return some_global'), 1), 0xff)
local GSET = band(jutil.funcbc(loadstring('some_global = 1'), 2), 0xff)
local function globals(fn, out)
  out = out or {}
  local pc = 1
  while true do
    local ins = jutil.funcbc(fn, pc)
    if not ins then break end
    local op = band(ins, 0xff)
    if op == GGET or op == GSET then out[jutil.funck(fn, -shr(ins, 16) - 1)] = true end
    pc = pc + 1
  end
  local n = -1
  while true do
    local k = jutil.funck(fn, n)
    if k == nil then break end
    if type(k) == 'proto' then globals(k, out) end
    n = n - 1
  end
  return out
end

-- Lua's own globals (LuaJIT's base library and its modules), and `arg`, the
-- script's command line, read by torch.config.parse
local lua_globals = {}
for name in ([[_G _VERSION arg assert bit collectgarbage coroutine debug dofile error gcinfo getfenv getmetatable io
  ipairs jit load loadfile loadstring math module newproxy next os package pairs pcall print rawequal rawget rawset
  require select setfenv setmetatable string table tonumber tostring type unpack xpcall]]):gmatch('%S+') do
  lua_globals[name] = true
end

-- foreign(sources) -> {'file reads name', ...}: the globals beyond Lua's own
-- that each {file = text} reads or sets (init.lua, which sets the globals
-- scripts see, is left out)
local function foreign(sources)
  local out = {}
  for file, text in pairs(sources) do
    if file ~= 'init.lua' then
      local fn = assert(loadstring(text, '@' .. file))
      for name in pairs(globals(fn)) do
        if not lua_globals[name] then out[#out + 1] = file .. ' reads ' .. name end
      end
    end
  end
  table.sort(out)
  return out
end

test('library files read no global of the library: torch, nn, optim ... are required', function()
  eq(table.concat(foreign(sources), '; '), '', 'globals read by library files (require them instead)')
  local private = {}
  for file, text in pairs(sources) do
    for name in text:gmatch('torch%._(%a[%w_]*)') do private[#private + 1] = file .. ': torch._' .. name end
  end
  table.sort(private)
  eq(table.concat(private, '; '), '', "private natives are require('anatomy.torch.native'), not torch._*")
end)

test('a planted global read fails, in a function and at the top', function()
  local planted = {
    ['nn/Planted.lua'] = "local M = {}\nfunction M.f(x) return torch.zeros(x) end\nreturn M\n",
    ['probe/planted.lua'] = "local x = nn.Linear\nlocal t = {}\nt.table = table.concat\nreturn t\n",
    ['probe/fine.lua'] = "local torch = require('anatomy.torch')\nlocal nn = {}\nreturn function() return torch, nn.x, string.rep end\n",
  }
  eq(table.concat(foreign(planted), '; '), 'nn/Planted.lua reads torch; probe/planted.lua reads nn')
  local torch_global = require('anatomy.torch')
  eq(rawget(torch_global, '_now'), nil, 'torch._now is gone from torch')
  eq(type(require('anatomy.torch.native').now), 'function', 'native.now')
end)

H.done()
