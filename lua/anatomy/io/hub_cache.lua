-- hub_cache: the Hugging Face cache on disk as the Hub client (hub.lua)
-- writes and reads it, and the rules that keep it safe from what a server
-- sends: names checked before they become paths (cache.cache_paths), folders
-- made one level at a time, entries planted by others removed rather than
-- followed, a snapshot entry used only when it links into its repository's
-- blobs/, every blob checked against its size and digest. Its functions are
-- hub's too (hub.bad_name, hub.cache_paths, ...).
local native = require('anatomy.torch.native')
local fs = require('anatomy.io.fs')

local cache = {}

-- A file the client reads that is not its own (the token file, a ref): a
-- regular file, never a FIFO (which would block the open) or a device.
function cache.read_small(path)
  local kind = native.lstat_kind(path)
  if kind == 'link' then kind = native.realpath(path) and native.lstat_kind(native.realpath(path)) end
  if kind ~= 'file' then return nil, kind end
  local f = io.open(path, 'rb')
  if not f then return nil end
  local text = f:read(4096)
  f:close()
  return text or ''
end

function cache.is_commit(rev) return type(rev) == 'string' and #rev == 40 and rev:match('^%x+$') ~= nil end

-- hub.bad_name(name) -> nil when name is a relative path of plain segments
-- (what a repository's file name, a shard's name or a revision must be),
-- else why it is not: empty, absolute, a '.' or '..' segment, an empty
-- segment, a backslash or control character, over 1000 bytes
function cache.bad_name(name)
  if type(name) ~= 'string' then return 'is not a string' end
  if name == '' then return 'is empty' end
  if #name > 1000 then return 'is longer than 1000 bytes' end
  if name:find('[%z\1-\31\127\\]') then return 'holds a control character or a backslash' end
  if name:sub(1, 1) == '/' then return 'is an absolute path' end
  for segment in (name .. '/'):gmatch('([^/]*)/') do
    if segment == '' then return "has an empty segment ('//' or a '/' at the end)" end
    if segment == '.' or segment == '..' then return ("has a '%s' segment"):format(segment) end
  end
end

-- A name from the server as an error shows it: control characters escaped,
-- cut after 120 bytes
function cache.shown(name)
  name = tostring(name)
  local cut = #name > 120 and ('... (%d bytes)'):format(#name) or ''
  return (name:sub(1, 120):gsub('[%z\1-\31\127]', function(c) return ('\\%d'):format(c:byte()) end)) .. cut
end

-- hub.digest_kind(d) -> 'sha256' (64 hex digits, an LFS file's), 'git-sha1'
-- (40, git's blob id) or nil: the forms a blob's name may take
function cache.digest_kind(d)
  if type(d) ~= 'string' or not d:match('^%x+$') then return nil end
  return #d == 64 and 'sha256' or #d == 40 and 'git-sha1' or nil
end

-- hub.normalize(path) -> path with '.' and '..' segments folded (lexically,
-- no link followed) and repeated '/' removed
function cache.normalize(path)
  local out = {}
  for segment in path:gmatch('[^/]+') do
    if segment == '..' then
      if #out > 0 and out[#out] ~= '..' then out[#out] = nil else out[#out + 1] = '..' end
    elseif segment ~= '.' then
      out[#out + 1] = segment
    end
  end
  return (path:sub(1, 1) == '/' and '/' or '') .. table.concat(out, '/')
end

-- hub.is_inside(root, path) -> whether path (lexically) lies below root
function cache.is_inside(root, path)
  local r, p = cache.normalize(root), cache.normalize(path)
  return p:sub(1, #r + 1) == r .. '/' and #p > #r + 1
end

function cache.segments(name)
  local n = 0
  for _ in name:gmatch('[^/]+') do n = n + 1 end
  return n
end

-- hub.cache_paths(cache_dir, repo_id, {commit, file, digest, revision})
-- -> {repo, locks, blobs, snapshot, file, link, blob, part, lock, ref}: the
-- paths the cache code writes or links, each built from checked parts and
-- checked to stay inside cache_dir (an error naming the part otherwise).
-- `link` is the relative target of file's link, which resolves to `blob`.
function cache.cache_paths(cache_dir, repo_id, parts)
  local where = parts.where or 'hub'
  if not cache.is_repo_id(repo_id) then error(("%s: '%s' is not a Hub repository id"):format(where, tostring(repo_id)), 0) end
  local folder = 'models--' .. repo_id:gsub('/', '--')
  local p = {repo = cache_dir .. '/' .. folder, locks = cache_dir .. '/.locks/' .. folder}
  p.blobs = p.repo .. '/blobs'
  if parts.commit ~= nil then
    if not cache.is_commit(parts.commit) then
      error(("%s: the Hub's commit id '%s' is not 40 hex digits"):format(where, cache.shown(parts.commit)), 0)
    end
    p.snapshot = p.repo .. '/snapshots/' .. parts.commit:lower()
  end
  if parts.file ~= nil then
    local why = cache.bad_name(parts.file)
    if why then
      error(("%s: the file name '%s' %s: refused (a repository's file is a relative path of plain segments)"):format(
        where, cache.shown(parts.file), why), 0)
    end
    p.file = p.snapshot .. '/' .. parts.file
  end
  if parts.digest ~= nil then
    if not cache.digest_kind(parts.digest) then
      error(("%s: '%s' is neither a SHA-256 nor a git blob id: no blob is named by it"):format(where, cache.shown(parts.digest)), 0)
    end
    local d = parts.digest:lower()
    p.blob, p.part, p.lock = p.blobs .. '/' .. d, p.blobs .. '/' .. d .. '.incomplete', p.locks .. '/' .. d .. '.lock'
    if p.file then p.link = ('../'):rep(cache.segments(parts.file) + 1) .. 'blobs/' .. d end
  end
  if parts.revision ~= nil then
    local why = cache.bad_name(parts.revision)
    if why then error(("%s: revision '%s' %s: not a branch, tag or commit name"):format(where, cache.shown(parts.revision), why), 0) end
    p.ref = p.repo .. '/refs/' .. parts.revision
  end
  for _, key in ipairs{'repo', 'locks', 'blobs', 'snapshot', 'file', 'blob', 'part', 'lock', 'ref'} do
    if p[key] and not cache.is_inside(cache_dir, p[key]) then
      error(("%s: the cache path %s would lie outside the cache %s"):format(where, p[key], cache_dir), 0)
    end
  end
  if p.link and cache.normalize(fs.dirname(p.file) .. '/' .. p.link) ~= cache.normalize(p.blob) then
    error(("%s: the link %s -> %s would not name its blob"):format(where, p.file, p.link), 0)
  end
  return p
end

-- Makes path's folders below root one level at a time; a link or file where
-- a folder should be is an error (a folder is never made through a link).
function cache.make_dirs(root, path, where)
  fs.mkdir(root)
  if not cache.is_inside(root, path) then error(("%s: %s is outside the cache %s"):format(where, path, root), 0) end
  local rest = cache.normalize(path):sub(#cache.normalize(root) + 2)
  local at = root
  for segment in rest:gmatch('[^/]+') do
    at = at .. '/' .. segment
    local ok, err = pcall(native.mkdir, at)
    if not ok then
      error(('%s: %s (the cache is not as anatomy or huggingface_hub leave it: remove that entry)'):format(where,
        (tostring(err):gsub('^torch%._mkdir: ', ''))), 0)
    end
  end
end

-- hub.is_repo_id(name) -> whether name has the form of a Hub repository id:
-- 'name' or 'org/name', letters, digits, '-', '_' and '.', neither '--' nor
-- '..', at most 96 characters
function cache.is_repo_id(name)
  if type(name) ~= 'string' or #name == 0 or #name > 96 then return false end
  if name:find('%-%-') or name:find('%.%.') then return false end
  local a, b = name:match('^([%w%-_.]+)/([%w%-_.]+)$')
  if not a then a = name:match('^[%w%-_.]+$') end
  if not a then return false end
  return not (name:match('^[%-.]') or name:match('[%-.]$'))
end

-- hub.repo_folder(repo_id, cache_dir) -> the repository's folder in the cache
function cache.repo_folder(repo_id, cache_dir)
  return cache_dir .. '/models--' .. repo_id:gsub('/', '--')
end

-- Whether the snapshot entry at p.file can be used as it is: a link made as
-- anatomy and huggingface_hub make them, into this repository's blobs/, to
-- a regular file (named by the listed digest, of the listed size, when the
-- listing says them); offline, a regular file (a copy) too. Else false and why.
function cache.usable(session, p, want)
  local kind = native.lstat_kind(p.file)
  if kind == nil then return false, 'it is missing' end
  if kind == 'file' and session.offline then return true end
  if kind ~= 'link' then return false, ('it is a %s, not a link into blobs/'):format(kind) end
  local real, blobs = native.realpath(p.file), native.realpath(p.blobs)
  if not real or not blobs or real:sub(1, #blobs + 1) ~= blobs .. '/' or real:find('/', #blobs + 2, true) then
    return false, ('its link %s does not lead into %s'):format(tostring(native.readlink(p.file)), p.blobs)
  end
  if native.lstat_kind(real) ~= 'file' then return false, ('its blob %s is not a regular file'):format(real) end
  local name = real:sub(#blobs + 2)  -- offline, any name huggingface_hub gave it (a mirror's ETag)
  if not session.offline and not (want and want.digest) then
    return false, 'the listing gives no digest to check it by'  -- the file's HEAD will
  end
  if want and want.digest and name:lower() ~= want.digest then
    return false, ('its blob is %s, the listing says %s'):format(name, want.digest)
  end
  if want and want.size and native.file_size(real) ~= want.size then
    return false, ('its blob holds %d bytes, the listing says %d'):format(native.file_size(real), want.size)
  end
  return true
end

function cache.check_digest(path, digest, size, label, where)
  local have = native.file_size(path)
  if have ~= size then
    os.remove(path)
    error(('%s: the download of %s has %d bytes, the Hub said %d; removed, try again'):format(where, label, have, size), 0)
  end
  local kind = cache.digest_kind(digest)
  local got = native.file_digest(path, kind)
  if got ~= digest then
    os.remove(path)
    error(('%s: the download of %s has %s %s, the Hub said %s; removed, try again'):format(
      where, label, kind == 'sha256' and 'SHA-256' or 'git blob id', got, digest), 0)
  end
end

function cache.remove_foreign(path, what, where)
  local kind = native.lstat_kind(path)
  if kind ~= nil and kind ~= 'file' then  -- a link, FIFO or folder planted there: removed, never followed
    local ok = os.remove(path)
    if not ok then error(('%s: %s %s is a %s, not a file, and cannot be removed'):format(where, what, path, kind), 0) end
  end
end

return cache
