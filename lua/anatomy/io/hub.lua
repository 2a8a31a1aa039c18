-- hub: checkpoints by name from the Hugging Face Hub, into huggingface_hub's
-- own cache, so that Python and anatomy share every download both ways.
--
-- The cache ($HF_HUB_CACHE, else $HF_HOME/hub, else
-- $XDG_CACHE_HOME/huggingface/hub or ~/.cache/huggingface/hub) holds, per
-- repository, models--ORG--NAME/
--   blobs/<etag>                 each file's bytes, named by its ETag (the
--                                SHA-256 of an LFS file, git's blob id else)
--   snapshots/<commit>/<file>    relative links to the blobs
--   refs/<revision>              the commit a branch or tag named
-- and .locks/models--ORG--NAME/<etag>.lock while a blob is fetched.
--
-- One request lists a revision's files and fixes its commit; each file is
-- then asked for at that commit, so a snapshot never mixes two commits. A
-- blob is written as <etag>.incomplete (continued with a Range request after
-- a cut or a kill), its size and digest checked against the Hub's ETag, and
-- only then renamed into place: no file ever has its final name half written.
--
-- The Hub, a mirror or the cache may be hostile (docs/pretrained.md, "What
-- the Hub client trusts"): every path written or linked under the cache is
-- built by hub.cache_paths from checked parts (a file name or a revision is a
-- relative path of plain segments, a blob's name a SHA-256 or git blob id, a
-- commit 40 hex digits) and checked to stay inside; folders are made one
-- level at a time and never through a link; a part file and a lock are
-- opened without following a link; every file is checked against a digest
-- (the listing's, else the ETag's) or refused; every answer is bounded in
-- bytes and in time (hub.limits).
local native = require('anatomy.torch.native')
local fs = require('anatomy.io.fs')
local json = require('anatomy.io.json')
local options = require('anatomy.torch.options')
local cache = require('anatomy.io.hub_cache')
local http = require('anatomy.io.hub_http')

local hub = {}
for _, name in ipairs{'bad_name', 'digest_kind', 'normalize', 'is_inside', 'cache_paths', 'is_repo_id'} do
  hub[name] = cache[name]
end

local function truthy(v)
  v = v and v:upper()
  return v == '1' or v == 'ON' or v == 'YES' or v == 'TRUE'
end

local function home_cache()
  return os.getenv('XDG_CACHE_HOME') or ((os.getenv('HOME') or '') .. '/.cache')
end

-- hub.settings() -> {endpoint, cache_dir, offline, token_path}: what the
-- environment says, read at each call as huggingface_hub reads it
function hub.settings()
  local home = os.getenv('HF_HOME') or (home_cache() .. '/huggingface')
  local endpoint = (os.getenv('HF_ENDPOINT') or 'https://huggingface.co'):gsub('/+$', '')
  return {
    endpoint = endpoint,
    cache_dir = os.getenv('HF_HUB_CACHE') or os.getenv('HUGGINGFACE_HUB_CACHE') or (home .. '/hub'),
    offline = truthy(os.getenv('HF_HUB_OFFLINE')),
    token_path = os.getenv('HF_TOKEN_PATH') or (home .. '/token'),
  }
end

local function env_number(name, default, what)
  local v = os.getenv(name)
  if v == nil or v == '' then return default end
  local n = tonumber(v)
  if not n or n ~= n or n <= 0 or n > 1e6 then
    error(("%s must be a positive number of %s, got '%s'"):format(name, what, v), 0)
  end
  return n
end

-- hub.limits() -> {stall, metadata_stall, metadata_seconds, min_rate,
-- max_json_bytes, tries}: what bounds each request, read from the
-- environment at each call. A transfer with no byte for `stall` seconds
-- (HF_HUB_DOWNLOAD_TIMEOUT, 10) is cut, as is one that after that long
-- averages under `min_rate` bytes/s (ANATOMY_HUB_MIN_RATE, 1000); a download
-- is continued up to `tries` times (5) while each try brings bytes, and stops
-- at the size the listing or the Hub announced. A listing, a refs answer or a
-- file's HEAD (metadata) is cut after `metadata_stall` seconds without a byte
-- (HF_HUB_ETAG_TIMEOUT, 10) or `metadata_seconds` in all
-- (ANATOMY_HUB_METADATA_TIMEOUT, 60), and may hold at most `max_json_bytes`
-- (32 MiB).
function hub.limits()
  return {
    stall = env_number('HF_HUB_DOWNLOAD_TIMEOUT', 10, 'seconds'),
    metadata_stall = env_number('HF_HUB_ETAG_TIMEOUT', 10, 'seconds'),
    metadata_seconds = env_number('ANATOMY_HUB_METADATA_TIMEOUT', 60, 'seconds'),
    min_rate = env_number('ANATOMY_HUB_MIN_RATE', 1000, 'bytes per second'),
    max_json_bytes = 32 * 2 ^ 20,
    tries = 5,
  }
end

-- The token and where it came from (for messages, which never print it):
-- the token option (false: none), else $HF_TOKEN, else the file `hf auth
-- login` writes.
local function find_token(opts, s)
  if opts.token == false then return nil end
  if opts.token then return opts.token, 'the token option' end
  local env = os.getenv('HF_TOKEN')
  if env and env ~= '' then return env, 'HF_TOKEN' end
  local text = cache.read_small(s.token_path)
  if text then
    local t = text:match('^%s*(.-)%s*$')
    if t ~= '' then return t, ("the token file '%s'"):format(s.token_path) end
  end
end

-- hub.repo_folder(repo_id, cache_dir) -> the repository's folder in the cache
function hub.repo_folder(repo_id, cache_dir)
  return cache.repo_folder(repo_id, cache_dir or hub.settings().cache_dir)
end

local Snapshot = {}
Snapshot.__index = Snapshot

-- hub.open(repo_id, {revision = 'main', token, cache_dir, local_files_only,
-- where}) -> snapshot: the revision's commit fixed (snapshot.commit), its
-- files listed (snapshot.files, online), its folder in the cache
-- (snapshot.folder); snapshot:has(file) and snapshot:fetch(file) -> path.
-- Offline (HF_HUB_OFFLINE=1 or local_files_only) the cache alone answers.
function hub.open(repo_id, opts)
  opts = options.check(opts, {revision = true, token = true, cache_dir = true, local_files_only = true, where = true},
    'hub.open', 2)
  local where = opts.where or 'hub.open'
  if not hub.is_repo_id(repo_id) then
    error(("%s: '%s' is neither a folder nor a Hub repository id ('org/name')"):format(where, tostring(repo_id)), 0)
  end
  local revision = opts.revision or 'main'
  if type(revision) ~= 'string' or revision == '' then
    error(('%s: revision must be a branch, tag or commit name, got %s'):format(where, tostring(revision)), 0)
  end
  if opts.token ~= nil and opts.token ~= false and (type(opts.token) ~= 'string' or opts.token == '') then
    error(('%s: token must be a string or false, got %s'):format(where, type(opts.token)), 0)
  end
  local s = hub.settings()
  local session = {
    repo_id = repo_id, revision = revision, where = where, endpoint = s.endpoint,
    cache_dir = opts.cache_dir or s.cache_dir, offline = s.offline or opts.local_files_only == true,
    limits = hub.limits(),
  }
  local ref = not cache.is_commit(revision) and hub.cache_paths(session.cache_dir, repo_id, {revision = revision, where = where}).ref
  session.token, session.token_source = find_token(opts, s)
  session.repo = hub.repo_folder(repo_id, session.cache_dir)
  local snap = setmetatable({repo_id = repo_id, revision = revision, session = session}, Snapshot)
  if session.offline then
    local why = s.offline and 'HF_HUB_OFFLINE=1' or 'local_files_only'
    local commit = revision
    if ref then
      local text, kind = cache.read_small(ref)
      if not text then
        error(("%s: %s, and revision '%s' of '%s' is not in the cache (%s %s)"):format(where, why, revision, repo_id,
          kind and ('not a file: a ' .. kind .. ' at') or 'no', ref), 0)
      end
      commit = text:match('^%s*(%x+)%s*$') or ''
      if not cache.is_commit(commit) then error(("%s: %s holds no commit id"):format(where, ref), 0) end
    end
    snap.commit = commit:lower()
    snap.folder = hub.cache_paths(session.cache_dir, repo_id, {commit = snap.commit, where = where}).snapshot
    if native.lstat_kind(snap.folder) ~= 'directory' then
      error(("%s: %s, and commit %s of '%s' is not in the cache (no %s)"):format(where, why, commit, repo_id, snap.folder), 0)
    end
    return snap
  end
  -- blobs=true: each file's size and digest (the LFS SHA-256, else git's
  -- blob id) come with the listing, to check the files against
  local url = ('%s/api/models/%s/revision/%s?blobs=true'):format(s.endpoint, repo_id, http.quote_url(revision))
  local r = http.request(session, {method = 'GET', url = url})
  if r.error then error(('%s: %s'):format(where, http.reach_error(session, url, r)), 0) end
  if r.status ~= 200 then error(http.refusal(session, r, where), 0) end
  local ok, info = pcall(json.decode, r.body)
  if not ok or type(info) ~= 'table' or type(info.sha) ~= 'string' or not cache.is_commit(info.sha) then
    error(('%s: %s did not answer with a commit id (sha)'):format(where, url), 0)
  end
  snap.commit = info.sha:lower()
  snap.folder = hub.cache_paths(session.cache_dir, repo_id, {commit = snap.commit, where = where}).snapshot
  snap.files, snap._listed, snap.refused = {}, {}, {}
  for _, sibling in ipairs(type(info.siblings) == 'table' and info.siblings or {}) do
    local name = type(sibling) == 'table' and sibling.rfilename
    if type(name) == 'string' and hub.bad_name(name) then
      snap.refused[#snap.refused + 1] = name  -- never fetched: it would name a path outside its snapshot
    elseif type(name) == 'string' then
      local lfs = type(sibling.lfs) == 'table' and sibling.lfs or nil
      local entry = {}
      if lfs then
        entry.digest = hub.digest_kind(lfs.sha256) == 'sha256' and lfs.sha256:lower() or nil
        entry.size = lfs.size
      else
        entry.digest = hub.digest_kind(sibling.blobId) == 'git-sha1' and sibling.blobId:lower() or nil
        entry.size = sibling.size
      end
      if entry.size ~= nil and (type(entry.size) ~= 'number' or entry.size < 0 or entry.size >= 2 ^ 53
          or entry.size ~= math.floor(entry.size)) then
        entry.bad_size = tostring(entry.size)
        entry.size = nil
      end
      snap.files[#snap.files + 1] = name
      snap._listed[name] = entry
    end
  end
  table.sort(snap.files)
  if ref then
    cache.make_dirs(session.cache_dir, fs.dirname(ref), where)
    fs.write_atomic(ref, snap.commit)
  end
  return snap
end

-- snapshot:has(file) -> whether the revision has the file (offline: whether
-- the cache has it)
function Snapshot:has(file)
  if self._listed then return self._listed[file] ~= nil end
  if hub.bad_name(file) then return false end
  return native.lstat_kind(self.folder .. '/' .. file) ~= nil
end

-- Fetches a blob into p.blob, holding its lock: continued from its
-- .incomplete part while each try brings bytes, stopped at the announced
-- size, checked, then renamed into place.
local function fetch_blob(session, url, p, digest, size, label)
  cache.make_dirs(session.cache_dir, p.locks, session.where)
  cache.make_dirs(session.cache_dir, p.blobs, session.where)
  local limits = session.limits
  cache.remove_foreign(p.lock, 'the lock', session.where)
  local lock = native.lock(p.lock, label)
  local ok, err = pcall(function()
    if native.lstat_kind(p.blob) == 'file' and native.file_size(p.blob) == size then return end  -- fetched meanwhile
    cache.remove_foreign(p.blob, 'the blob', session.where)
    if native.lstat_kind(p.blob) == 'file' then os.remove(p.blob) end  -- of another size: not this file
    cache.remove_foreign(p.part, 'the part file', session.where)
    local tries = 0
    while true do
      local have = native.file_size(p.part) or 0
      if have > size then os.remove(p.part); have = 0 end
      if have == size then break end
      local r = http.request(session, {method = 'GET', url = url, output = p.part, resume_from = have > 0 and have or nil,
        progress = label, total = size, follow = true, max_bytes = size, stall_timeout = limits.stall,
        min_rate = limits.min_rate})
      if r.too_large then
        os.remove(p.part)
        error(('%s: the server sent more than the %d bytes announced for %s; stopped there, the part removed'):format(
          session.where, size, label), 0)
      end
      if not r.error and r.status >= 200 and r.status < 300 then break end
      if r.status == 416 and (native.file_size(p.part) or 0) == size then break end
      tries = tries + 1
      if not r.error then error(http.refusal(session, r, session.where .. ': ' .. label), 0) end
      if tries >= limits.tries or (r.written or 0) == 0 then
        error(('%s: %s (after %d %s%s; %s kept to continue from)'):format(session.where, http.reach_error(session, url, r),
          tries, tries == 1 and 'try' or 'tries', (r.written or 0) == 0 and ', the last bringing no byte' or '', p.part), 0)
      end
      io.stderr:write(('anatomy: %s: %s; continuing from byte %d\n'):format(label, r.error, native.file_size(p.part) or 0))
    end
    cache.check_digest(p.part, digest, size, label, session.where)
    local renamed, why = os.rename(p.part, p.blob)
    if not renamed then error(('%s: cannot move %s into place: %s'):format(session.where, p.part, tostring(why)), 0) end
  end)
  lock:release()
  if not ok then error(err, 0) end
end

local function parse_size(text, session, label)
  if text == nil then return nil end
  if not text:match('^%d+$') or #text > 15 then
    error(("%s: the server sent an impossible size '%s' for %s"):format(session.where, cache.shown(text), label), 0)
  end
  return tonumber(text)
end

-- snapshot:fetch(file) -> the file's path in the snapshot folder, fetched
-- from the Hub when the cache lacks it. Whatever the server says, the file
-- is checked against a digest (the listing's, else an ETag that is one) and
-- its size, or refused.
function Snapshot:fetch(file)
  local session = self.session
  local label = self.repo_id .. ' ' .. tostring(file)
  local p = hub.cache_paths(session.cache_dir, self.repo_id, {commit = self.commit, file = file, where = session.where})
  local want = self._listed and self._listed[file]
  local fine, why = cache.usable(session, p, want)
  if fine then return p.file end
  if session.offline then
    error(("%s: HF_HUB_OFFLINE=1 (or local_files_only), and the cache lacks %s of '%s' at %s (%s: %s)"):format(
      session.where, file, self.repo_id, self.commit, why == 'it is missing' and 'no' or 'unusable', p.file ..
      (why == 'it is missing' and '' or ' ' .. why)), 0)
  end
  if want and want.bad_size then
    error(("%s: the Hub's listing gives %s an impossible size '%s'"):format(session.where, label, want.bad_size), 0)
  end
  local url = ('%s/%s/resolve/%s/%s'):format(session.endpoint, self.repo_id, self.commit, http.quote_url(file, true))
  local r = http.request(session, {method = 'HEAD', url = url})
  if r.error then error(('%s: %s'):format(session.where, http.reach_error(session, url, r)), 0) end
  if r.status >= 400 then
    session.revision = self.revision
    error(http.refusal(session, r, session.where .. ': ' .. file), 0)
  end
  local etag = http.normalize_etag(r.headers['x-linked-etag'] or r.headers.etag)
  local digest = want and want.digest
  if hub.digest_kind(etag) then
    if digest and etag:lower() ~= digest then
      error(("%s: the Hub's listing gives %s the digest %s, its ETag says %s: refused"):format(
        session.where, label, digest, etag), 0)
    end
    digest = etag:lower()
  end
  if not digest then
    error(("%s: %s cannot be checked: its ETag '%s' is neither a SHA-256 nor a git blob id, and the listing gives no "
      .. "digest; refused (anatomy loads no file it cannot check)"):format(session.where, label, cache.shown(etag)), 0)
  end
  local announced = parse_size(r.headers['x-linked-size'] or (r.status < 300 and r.headers['content-length']) or nil,
    session, label)
  if want and want.size and announced and want.size ~= announced then
    error(("%s: the Hub's listing gives %s %d bytes, the file's answer %d: refused"):format(
      session.where, label, want.size, announced), 0)
  end
  local size = (want and want.size) or announced
  if not size then error(('%s: the Hub announced no size for %s: refused'):format(session.where, label), 0) end
  local from = (r.status >= 300 and r.headers.location) or r.url
  p = hub.cache_paths(session.cache_dir, self.repo_id, {commit = self.commit, file = file, digest = digest,
    where = session.where})
  if not (native.lstat_kind(p.blob) == 'file' and native.file_size(p.blob) == size) then
    fetch_blob(session, from, p, digest, size, label)
  end
  cache.make_dirs(session.cache_dir, fs.dirname(p.file), session.where)
  native.symlink(p.link, p.file)
  return p.file
end

-- hub.hf_hub_download(repo_id, filename, {revision, token, cache_dir,
-- local_files_only}) -> the file's path in the cache (as huggingface_hub's)
function hub.hf_hub_download(repo_id, filename, opts)
  opts = options.check(opts, {revision = true, token = true, cache_dir = true, local_files_only = true},
    'hub.hf_hub_download', 2)
  if type(filename) ~= 'string' or filename == '' then
    error(('hub.hf_hub_download: filename must be a string, got %s'):format(type(filename)), 0)
  end
  local why = hub.bad_name(filename)
  if why then
    error(("hub.hf_hub_download: the file name '%s' %s: refused (a repository's file is a relative path of plain "
      .. "segments)"):format(cache.shown(filename), why), 0)
  end
  opts.where = 'hub.hf_hub_download'
  local snap = hub.open(repo_id, opts)
  if not snap:has(filename) then
    error(("hub.hf_hub_download: '%s' at revision '%s' has no file %s"):format(repo_id, snap.revision, filename), 0)
  end
  return snap:fetch(filename)
end

-- The tokenizer files the loaders read, whichever of them a repository has
-- (added_tokens.json: the added tokens beside vocab.json + merges.txt, GPT-J's).
hub.tokenizer_files = {'tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json', 'vocab.json', 'merges.txt',
  'added_tokens.json', 'tokenizer.model'}

-- hub.pickle_refusal(where, what) -> the message for weights kept only as a
-- Python pickle (pytorch_model.bin)
function hub.pickle_refusal(where, what)
  return ("%s: %s has its weights only as pytorch_model.bin, a Python pickle; anatomy loads safetensors only (a pickle "
    .. "runs code when it is read, and reading one needs Python). Convert it once with transformers: python -c "
    .. "\"from transformers import AutoModelForCausalLM as M; M.from_pretrained('REPO_OR_FOLDER').save_pretrained('FOLDER')\" "
    .. "(save_pretrained writes model.safetensors), then open FOLDER; on the Hub, a conversion may already wait as a pull "
    .. "request (revision = 'refs/pr/N')"):format(where, what)
end

-- hub.has_pickle(has) -> whether a checkpoint whose files `has(name)` tells
-- keeps its weights as a pickle (pytorch_model.bin, or its shards' index)
function hub.has_pickle(has)
  return has('pytorch_model.bin') or has('pytorch_model.bin.index.json')
end

local function describe(snap)
  return ("'%s' at revision '%s'%s"):format(snap.repo_id, snap.revision,
    snap.revision ~= snap.commit and (' (commit ' .. snap.commit:sub(1, 12) .. ')') or '')
end

-- hub.fetch_model(repo_id, {revision, token, cache_dir, local_files_only,
-- where}) -> snapshot: only what models.from_pretrained reads fetched
-- (config.json, model.safetensors or its index and shards, the tokenizer files)
function hub.fetch_model(repo_id, opts)
  local snap = hub.open(repo_id, opts)
  local where = snap.session.where
  local function has(f) return snap:has(f) end
  if not has('config.json') then
    error(('%s: %s has no config.json%s'):format(where, describe(snap),
      snap.session.offline and ' in the cache (HF_HUB_OFFLINE=1 or local_files_only)' or ': not a transformers checkpoint'), 0)
  end
  snap:fetch('config.json')
  if has('model.safetensors') then
    snap:fetch('model.safetensors')
  elseif has('model.safetensors.index.json') then
    local index = snap:fetch('model.safetensors.index.json')
    local ok, idx = pcall(json.decode, fs.read(index))
    if not ok or type(idx) ~= 'table' or type(idx.weight_map) ~= 'table' then
      error(("%s: %s's model.safetensors.index.json has no weight_map"):format(where, describe(snap)), 0)
    end
    local shards, seen = {}, {}
    for _, file in pairs(idx.weight_map) do
      local why = hub.bad_name(file)
      if why then
        error(("%s: %s's index names a shard '%s' that %s: refused (a shard is a relative path of plain segments)"):format(
          where, describe(snap), cache.shown(file), why), 0)
      end
      if not seen[file] then seen[file] = true; shards[#shards + 1] = file end
    end
    table.sort(shards)
    for _, file in ipairs(shards) do snap:fetch(file) end
    snap.weight_files = shards
  elseif hub.has_pickle(has) then
    error(hub.pickle_refusal(where, describe(snap)), 0)
  else
    error(('%s: %s has neither model.safetensors nor model.safetensors.index.json%s'):format(where, describe(snap),
      snap.session.offline and ' in the cache (HF_HUB_OFFLINE=1 or local_files_only)' or ''), 0)
  end
  for _, f in ipairs(hub.tokenizer_files) do
    if has(f) then snap:fetch(f) end
  end
  -- the weights' identity: the blobs (content hashes) their links name, so
  -- that two revisions serving the same weights can be told apart from two
  -- that differ (a checkpoint series says so)
  local blobs = {}
  for _, f in ipairs(snap.weight_files or {'model.safetensors'}) do
    local target = native.readlink(snap.folder .. '/' .. f)
    blobs[#blobs + 1] = target and target:match('([^/]+)$') or f
  end
  snap.weights_id = table.concat(blobs, ',')
  return snap
end

-- hub.fetch_tokenizer(repo_id, opts) -> snapshot with the tokenizer files fetched
function hub.fetch_tokenizer(repo_id, opts)
  local snap = hub.open(repo_id, opts)
  local any = false
  for _, f in ipairs(hub.tokenizer_files) do
    if snap:has(f) then snap:fetch(f); any = true end
  end
  if not any then
    error(('%s: %s has no tokenizer file (%s)'):format(snap.session.where, describe(snap),
      table.concat(hub.tokenizer_files, ', ')), 0)
  end
  return snap
end

-- hub.list_repo_refs(repo_id, {token}) -> {branches = {{name, commit}...},
-- tags = {...}}: the revisions a checkpoint series can walk (Pythia's
-- step1000, step2000, ... are branches)
function hub.list_repo_refs(repo_id, opts)
  opts = options.check(opts, {token = true}, 'hub.list_repo_refs', 2)
  local where = 'hub.list_repo_refs'
  if not hub.is_repo_id(repo_id) then error(("%s: '%s' is not a Hub repository id"):format(where, tostring(repo_id)), 0) end
  local s = hub.settings()
  if s.offline then error(('%s: HF_HUB_OFFLINE=1: the Hub cannot be asked'):format(where), 0) end
  local session = {repo_id = repo_id, revision = 'main', where = where, endpoint = s.endpoint, limits = hub.limits()}
  session.token, session.token_source = find_token(opts, s)
  local url = ('%s/api/models/%s/refs'):format(s.endpoint, repo_id)
  local r = http.request(session, {method = 'GET', url = url})
  if r.error then error(('%s: %s'):format(where, http.reach_error(session, url, r)), 0) end
  if r.status ~= 200 then error(http.refusal(session, r, where), 0) end
  local ok, info = pcall(json.decode, r.body)
  if not ok or type(info) ~= 'table' then error(('%s: %s did not answer with JSON'):format(where, url), 0) end
  local out = {branches = {}, tags = {}}
  for _, kind in ipairs{'branches', 'tags'} do
    for _, ref in ipairs(type(info[kind]) == 'table' and info[kind] or {}) do
      out[kind][#out[kind] + 1] = {name = ref.name, commit = ref.targetCommit}
    end
  end
  return out
end

return hub
