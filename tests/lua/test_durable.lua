-- Files written so that a crash never leaves half of one: fs.write_atomic,
-- torch.save_safetensors, the temporary files a killed writer leaves, and the
-- log of a run that is resumed. (The kill -9 test itself is
-- tests/durability/test_kill9.py.)
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, raises = H.test, H.eq, H.raises
local fs = require('anatomy.io.fs')

local tmpdir = H.tmpdir
local function listing(dir)
  local p = io.popen('ls -A ' .. fs.quote(dir))
  local names = {}
  for n in p:lines() do names[#names + 1] = n end
  p:close()
  return table.concat(names, ' ')
end
local function put(path, text) local f = assert(io.open(path, 'wb')); f:write(text); f:close() end
-- a pid that no process has: past the kernel's largest
local dead = 4194304 + 17

test('fs.write_atomic replaces a file whole and leaves nothing beside it', function()
  local d = tmpdir()
  fs.write_atomic(d .. '/a.txt', 'first')
  fs.write_atomic(d .. '/a.txt', 'second')
  eq(fs.read(d .. '/a.txt'), 'second')
  eq(listing(d), 'a.txt')
  os.execute('rm -rf ' .. fs.quote(d))
end)

test('a write that cannot happen is an error naming the path, and the old file stays', function()
  local d = tmpdir()
  fs.write_atomic(d .. '/a.txt', 'kept')
  fs.mkdir(d .. '/sub')
  raises(function() fs.write_atomic(d .. '/sub', 'x') end, "cannot write '" .. d .. "/sub': Is a directory")
  os.execute('chmod 500 ' .. fs.quote(d))
  if not io.open(d .. '/probe', 'wb') then  -- not root: the folder is read-only now
    raises(function() fs.write_atomic(d .. '/a.txt', 'lost') end, "cannot write '" .. d .. "/a.txt': Permission denied")
    eq(fs.read(d .. '/a.txt'), 'kept')
  end
  os.execute('chmod 700 ' .. fs.quote(d))
  raises(function() torch.save_safetensors(d .. '/sub', {x = torch.zeros(2)}) end,
    "cannot write '" .. d .. "/sub': Is a directory")
  eq(listing(d):gsub(' ?probe', ''), 'a.txt sub')
  os.execute('rm -rf ' .. fs.quote(d))
end)

test('the temporary file of a writer that was killed is removed by the next write, a live one is kept', function()
  local d = tmpdir()
  put(d .. '/w.safetensors.tmp.' .. dead, 'half a file')
  put(d .. '/w.safetensors.tmp.1', 'init is alive')          -- pid 1 runs: another writer's, kept
  put(d .. '/w.safetensors.tmp.notapid', 'not ours')        -- not a temporary name of ours
  torch.save_safetensors(d .. '/w.safetensors', {x = torch.ones(3)})
  eq(listing(d), 'w.safetensors w.safetensors.tmp.1 w.safetensors.tmp.notapid')
  eq(torch.load_safetensors(d .. '/w.safetensors').x:sum():item(), 3)
  put(d .. '/r.json.tmp.' .. dead, '{')
  eq(fs.remove_stale(d .. '/r.json'), 1)
  eq(fs.remove_stale(d .. '/r.json'), 0)
  os.execute('rm -rf ' .. fs.quote(d))
end)

local text = ('it was the best of times, it was the worst of times. '):rep(20)
local function fit(dir, opts)
  local c = data.from_string(text)
  torch.manual_seed(1)
  local m = models.gpt{vocab = c.vocab_size, dim = 16, heads = 2, layers = 1, seq = 16, ffn = 32}
  local o = {steps = 12, batch = 2, seq = 16, seed = 2, quiet = true, eval_every = 100,
             checkpoint = dir .. '/ck', checkpoint_every = 4, log = dir .. '/log.jsonl'}
  for k, v in pairs(opts or {}) do o[k] = v end
  return train.fit(m, c, o)
end

test('train.fit removes what a killed writer left beside its checkpoint and log', function()
  local d = tmpdir()
  put(d .. '/ck.tmp.' .. dead, 'partial')
  put(d .. '/log.jsonl.tmp.' .. dead, 'partial')
  fit(d)
  eq(listing(d), 'ck log.jsonl')
  os.execute('rm -rf ' .. fs.quote(d))
end)

test('a resumed run\'s log keeps the steps up to its checkpoint; a fresh run starts the log anew', function()
  local d = tmpdir()
  local whole = fit(d)
  local want = fs.read(d .. '/log.jsonl'):gsub(', "tokens_per_second": [^}]*', '')
  eq(#train.read_metrics(d .. '/log.jsonl'), 12)
  -- a run killed after step 9 (checkpoint at 8): steps 9 and a cut-short 10 in the log
  os.remove(d .. '/ck')
  local killed = {}
  pcall(fit, d, {on_step = function(s) if s == 9 then error('killed') end end})
  local f = assert(io.open(d .. '/log.jsonl', 'ab')); f:write('{"step": 10, "lo'); f:close()
  local resumed = fit(d)
  eq(resumed.resumed_from, 8)
  eq(resumed.train[4], whole.train[12])
  eq(fs.read(d .. '/log.jsonl'):gsub(', "tokens_per_second": [^}]*', ''), want)
  -- a fresh run (resume = false) does not append to the old log
  fit(d, {resume = false, steps = 3, checkpoint = d .. '/other'})
  eq(#train.read_metrics(d .. '/log.jsonl'), 3)
  os.execute('rm -rf ' .. fs.quote(d))
end)

test('train.fit checks its file options', function()
  raises(function() fit('/tmp', {checkpoint = ''}) end, 'train.fit: checkpoint must be a file path (a non-empty string), got an empty string')
  raises(function() fit('/tmp', {log = 3}) end, 'train.fit: log must be a file path (a non-empty string), got number')
  raises(function() fit('/tmp', {checkpoint_every = 0}) end, 'train.fit: checkpoint_every must be a positive integer, got 0')
end)

H.done()
