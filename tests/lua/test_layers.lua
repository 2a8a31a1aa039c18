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

H.done()
