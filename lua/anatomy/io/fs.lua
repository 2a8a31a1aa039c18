-- fs: the few file operations the library needs, written once: whether a
-- file exists, making a folder, reading a file, and writing one atomically
-- (a temporary file fsynced and renamed into place, so no reader sees half a
-- file, even after a kill -9 or a power cut).
local native = require('anatomy.torch.native')
local fs = {}

local function quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
fs.quote = quote

-- fs.exists(path) -> true when something is at path (a link followed). It
-- opens nothing: opening a FIFO to see whether it is there would block, and
-- the reader that comes next refuses what is not a regular file.
function fs.exists(path)
  return type(path) == 'string' and path ~= '' and native.realpath(path) ~= nil
end

-- fs.is_dir(path) -> true when path is a folder (path/. opens only for a folder)
function fs.is_dir(path)
  local f = io.open(path .. '/.', 'rb')
  if f then f:close() end
  return f ~= nil
end

-- fs.mkdir(dir): makes dir and its parents; an error naming dir when it cannot
function fs.mkdir(dir)
  if dir == nil or dir == '' or dir == '.' then return end
  local ok = os.execute('mkdir -p ' .. quote(dir) .. ' 2>/dev/null')
  if ok ~= 0 and ok ~= true then error(("cannot make the folder '%s'"):format(dir), 2) end
end

-- fs.dirname(path) -> the folder part of path, or nil
function fs.dirname(path) return path:match('^(.*)/[^/]*$') end

-- fs.read(path) -> the file's bytes; an error naming path when it cannot be read
function fs.read(path)
  local why = type(path) == 'string' and native.not_a_file(path)
  if why then error(("cannot read '%s': it %s"):format(path, why), 2) end
  local f, err = io.open(path, 'rb')
  if not f then error(("cannot read '%s' (%s)"):format(path, err), 2) end
  local s = f:read('*a')
  f:close()
  if s == nil then error(("cannot read '%s'"):format(path), 2) end
  return s
end

-- fs.write_atomic(path, text) -> path: writes a temporary file beside path,
-- fsyncs it, renames it over path and fsyncs the folder (making the folder
-- first): a failed write, or a process killed in the middle, leaves path as
-- it was, never a partial file.
function fs.write_atomic(path, text)
  fs.mkdir(fs.dirname(path))
  local ok, err = pcall(native.write_atomic, path, text)
  if not ok then error((tostring(err):gsub('^torch%._write_atomic: ', '')), 2) end
  return path
end

-- fs.sync(path): forces what was appended to path onto the disk
function fs.sync(path)
  local ok, err = pcall(native.sync_file, path)
  if not ok then error((tostring(err):gsub('^torch%._sync_file: ', '')), 2) end
end

-- fs.list(dir) -> the names in dir, sorted; an error naming dir when it cannot be listed
function fs.list(dir)
  local ok, names = pcall(native.list_dir, dir)
  if not ok then error((tostring(names):gsub('^torch%._list_dir: ', '')), 2) end
  return names
end

-- fs.remove_stale(path) -> n: removes path.tmp.<pid> files that writers
-- killed before their rename left beside path (their process is gone)
function fs.remove_stale(path) return native.remove_stale_temporaries(path) end

return fs
