-- fs: the few file operations the library needs, written once: whether a
-- file exists, making a folder, reading a file, and writing one atomically
-- (a temporary file renamed into place, so no reader sees half a file).
local fs = {}

local function quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
fs.quote = quote

-- fs.exists(path) -> true when path can be opened for reading
function fs.exists(path)
  local f = io.open(path, 'rb')
  if f then f:close() end
  return f ~= nil
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
  local f, err = io.open(path, 'rb')
  if not f then error(("cannot read '%s' (%s)"):format(path, err), 2) end
  local s = f:read('*a')
  f:close()
  return s
end

-- fs.write_atomic(path, text) -> path: writes path.tmp, then renames it over
-- path (making the folder first); a failed write leaves no partial file.
function fs.write_atomic(path, text)
  fs.mkdir(fs.dirname(path))
  local tmp = path .. '.tmp'
  local f, err = io.open(tmp, 'wb')
  if not f then error(("cannot write '%s' (%s)"):format(path, err), 2) end
  local ok, werr = f:write(text)
  f:close()
  if not ok then
    os.remove(tmp)
    error(("cannot write '%s' (%s)"):format(path, werr), 2)
  end
  local renamed, rerr = os.rename(tmp, path)
  if not renamed then
    os.remove(tmp)
    error(("cannot write '%s' (%s)"):format(path, rerr), 2)
  end
  return path
end

return fs
