-- Files in and out (lua/anatomy/io/): JSON, provenance records, and every
-- reader's refusal of what is not a regular file.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local native = require('anatomy.torch.native')
local test, eq, close, raises = H.test, H.eq, H.close, H.raises
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')


test('published provenance names data by file name and a relative path, never an absolute one', function()
  -- the global: the record (io/provenance.lua) and its text (render/provenance.lua)
  local path = H.tmpfile(string.rep('some text for a corpus. ', 50))
  local corpus = data.text(path)
  local rec = provenance.record{corpus = corpus, config = {data = path, steps = 3}}
  eq(rec.data.path, path:match('[^/]+$'), 'a file outside the source tree: its name')
  eq(rec.config.data, path:match('[^/]+$'), "a script's --data=/abs/path")
  eq(rec.data.sha256, data.sha256(H.read(path)))
  local root = provenance.source_root()
  if root then eq(provenance.relative(root .. '/README.md'), 'README.md', 'inside the source tree: relative to it') end
  local line = provenance.line(rec)
  assert(not line:find('/tmp', 1, true) and not line:find('%s/'), 'no absolute path in: ' .. line)
  os.remove(path)
end)

test('every file reader says a directory is a directory, a FIFO is not a regular file, and a short read is short', function()
  local dir = H.tmpdir()
  local fifo = dir .. '/fifo'
  os.execute("mkfifo '" .. fifo .. "'")
  local model = models.gpt{vocab = 5, dim = 8, heads = 2, layers = 1, seq = 4, ffn = 8}
  local readers = {
    {'torch.load_safetensors', function(p) return torch.load_safetensors(p) end},
    {'torch.safe_open', function(p) return torch.safe_open(p) end},
    {'data.text', function(p) return data.text(p) end},
    {'data.file_info', function(p) return data.file_info(p) end},
    {'train.load_checkpoint', function(p) return train.load_checkpoint(p, model) end},
    {'train.read_metrics', function(p) return train.read_metrics(p) end},
  }
  for _, r in ipairs(readers) do
    H.raises_part(function() return r[2](dir) end, "'" .. dir .. "' is a directory")
    H.raises_part(function() return r[2](fifo) end, "'" .. fifo .. "' is not a regular file (a FIFO)")
  end
  -- the pieces of a checkpoint folder and a tokenizer folder, each a directory where a file belongs
  local folder = H.tmpdir()
  os.execute("mkdir '" .. folder .. "/config.json'")
  H.raises_part(function() models.from_pretrained(folder) end, 'config.json')
  H.raises_part(function() models.from_pretrained(folder) end, 'is a directory')
  local tok = H.tmpdir()
  os.execute("mkdir '" .. tok .. "/tokenizer.json'")
  H.raises_part(function() data.tokenizer(tok) end, 'is a directory')
  local sp = H.tmpdir()
  os.execute("mkdir '" .. sp .. "/tokenizer.model'")
  H.raises_part(function() data.tokenizer(sp) end, 'is a directory')
  -- a file whose size says more than a read gives (sysfs): the reader counts what came
  local short = '/sys/devices/system/cpu/online'
  if require('anatomy.io.fs').exists(short) then
    H.raises_part(function() torch.load_safetensors(short) end, 'of the 8 bytes of the header length could be read')
    H.raises_part(function() data.tokenizer(short) end, 'bytes came')
  end
  os.execute("rm -rf '" .. dir .. "' '" .. folder .. "' '" .. tok .. "' '" .. sp .. "'")
end)

-- lua_readers: a string with DEL (0x7f) in it made json.decode loop forever
-- (Lua's %c matches DEL; the scan made no progress on it).
test('json.decode takes DEL as the ordinary character it is, and an unterminated string ends in an error', function()
  eq(json.decode('"a\127b"'), 'a\127b')
  eq(json.decode('{"k": "\127\127"}').k, '\127\127')
  raises(function() json.decode('"\127\127\127-') end, 'json.decode: unterminated string at byte 6')
  raises(function() json.decode('"a\1b"') end, 'json.decode: control character in a string at byte 3')
end)

test('a file lock is a handle: released by release() or the collector; a second lock of one path in one process is an error, not a wait', function()
  local dir = H.tmpdir()
  local path = dir .. '/blob.lock'
  local lock = native.lock(path, 'a blob')
  H.raises(function() native.lock(path, 'a blob') end, "this process already holds the lock '" .. path .. "'")
  lock:release()
  lock:release()  -- again is harmless
  local again = native.lock(path)
  again = nil
  collectgarbage()
  collectgarbage()
  native.lock(path):release()  -- the collector let the last one go
  H.raises_part(function() native.lock(dir .. '/no/such/folder/x.lock') end, "cannot open the lock '" .. dir .. "/no/such/folder/x.lock'")
end)

H.done()
