-- Every path the Hub client's cache code writes or links (hub.cache_paths)
-- stays inside the cache, whatever the Hub sends as a file name, a shard
-- name, an ETag, a commit id or a revision: each hostile part is either
-- refused with an error naming it, or gives paths that lie below the cache and
-- a link that resolves to its own blob. Then the cache's folders are made one
-- level at a time, never through a link planted in them (the online half,
-- against a hostile server, is tests/hub/test_hub.py).
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, raises = H.test, H.eq, H.raises_part
local hub = require('anatomy.io.hub')

local cache = '/tmp/anatomy-hub-paths/a/cache'
local good = {commit = ('a'):rep(40), file = 'config.json', digest = ('b'):rep(64), revision = 'main'}

local hostile = {
  file = {'../x', '../../../../etc/passwd', 'a/../../b', './x', 'a/./b', 'a//b', '/etc/passwd', 'a/', '', '.', '..',
    'a\\..\\b', 'x\0y', 'x\ny', ('a/'):rep(600) .. 'b'},
  digest = {'..', '.', '', '../../x', ('a'):rep(63), ('a'):rep(65), ('g'):rep(64), 'W/"abc"', ('a'):rep(39) .. '/'},
  commit = {'..', '../' .. ('a'):rep(37), ('a'):rep(39), ('z'):rep(40), '', ('a'):rep(40) .. '/..'},
  revision = {'../../x', '..', '.', '/abs', 'a/../../b', 'refs/../../..', '', 'a//b', 'x\0y'},
}

local function all_inside(p)
  for _, key in ipairs{'repo', 'locks', 'blobs', 'snapshot', 'file', 'blob', 'part', 'lock', 'ref'} do
    if p[key] and not hub.is_inside(cache, p[key]) then return false, key .. ' = ' .. p[key] end
  end
  if p.link and hub.normalize(p.file:match('^(.*)/') .. '/' .. p.link) ~= hub.normalize(p.blob) then
    return false, 'the link does not resolve to its blob'
  end
  return true
end

test('a hostile part is refused by name, or every path stays inside the cache', function()
  local refused, allowed = 0, 0
  for part, values in pairs(hostile) do
    for _, v in ipairs(values) do
      local parts = {}
      for k, x in pairs(good) do parts[k] = x end
      parts[part] = v
      local ok, p = pcall(hub.cache_paths, cache, 'org/model', parts)
      if ok then
        allowed = allowed + 1
        local inside, why = all_inside(p)
        eq(inside, true, ('%s %q gives a path outside the cache: %s'):format(part, v, tostring(why)))
      else
        refused = refused + 1
        local shown = v:sub(1, 120):gsub('[%z\1-\31]', function(c) return '\\' .. c:byte() end)
        eq(tostring(p):find("'" .. shown, 1, true) ~= nil, true, ('the error names the %s: %s'):format(part, tostring(p)))
        eq(#tostring(p) < 600, true, 'a long name is cut in the message')
      end
    end
  end
  -- every one of these is hostile: none may pass
  eq(allowed, 0, 'no hostile part is accepted')
  print(('      %d hostile parts refused'):format(refused))
end)

test('good parts give the layout huggingface_hub uses, and nested files link back up', function()
  local p = hub.cache_paths(cache, 'org/model', good)
  eq(p.file, cache .. '/models--org--model/snapshots/' .. good.commit .. '/config.json')
  eq(p.link, '../../blobs/' .. good.digest)
  eq(p.ref, cache .. '/models--org--model/refs/main')
  eq(p.lock, cache .. '/.locks/models--org--model/' .. good.digest .. '.lock')
  local nested = hub.cache_paths(cache, 'org/model', {commit = good.commit, file = 'a/b/c.txt', digest = ('C'):rep(40)})
  eq(nested.link, '../../../../blobs/' .. ('c'):rep(40), 'a blob is named by its digest in lower case')
  eq(select(1, all_inside(nested)), true)
  eq(hub.cache_paths(cache, 'org/model', {revision = 'refs/pr/1'}).ref, cache .. '/models--org--model/refs/refs/pr/1')
  -- odd but plain names are files like any other (a '%' is a character, sent as %25)
  for _, name in ipairs{'..%2F..%2Fx', '...', '.hidden', 'a..b', 'x y.txt'} do
    local q = hub.cache_paths(cache, 'org/model', {commit = good.commit, file = name, digest = good.digest})
    eq(select(1, all_inside(q)), true, name)
  end
end)

test('a repository id that climbs is refused', function()
  for _, id in ipairs{'../x', 'org/..', 'org/../../x', '..', 'a--b/c', '/abs', 'org/x/y'} do
    raises(function() hub.cache_paths(cache, id, good) end, 'is not a Hub repository id')
  end
end)

test('hub.normalize and hub.is_inside fold dot segments lexically', function()
  eq(hub.normalize('/a/b/../c/./d//e'), '/a/c/d/e')
  eq(hub.normalize('a/../../b'), '../b')
  eq(hub.is_inside('/c', '/c/x'), true)
  eq(hub.is_inside('/c', '/c'), false)
  eq(hub.is_inside('/c', '/cx/y'), false)
  eq(hub.is_inside('/c', '/c/x/../../y'), false)
end)

test('hub.hf_hub_download refuses a climbing file name before asking the Hub', function()
  raises(function() hub.hf_hub_download('org/model', '../../x', {cache_dir = cache}) end, "has a '..' segment")
  raises(function() hub.open('org/model', {revision = '../../x', cache_dir = cache}) end, 'not a branch, tag or commit name')
end)

H.done()
