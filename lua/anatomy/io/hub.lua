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
local fs = (require('anatomy.io.fs'))
local json = (require('anatomy.io.json'))
local options = (require('anatomy.torch.options'))

local hub = {}

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

-- The token and where it came from (for messages, which never print it):
-- the token option (false: none), else $HF_TOKEN, else the file `hf auth
-- login` writes.
local function find_token(opts, s)
  if opts.token == false then return nil end
  if opts.token then return opts.token, 'the token option' end
  local env = os.getenv('HF_TOKEN')
  if env and env ~= '' then return env, 'HF_TOKEN' end
  local f = io.open(s.token_path, 'rb')
  if f then
    local t = (f:read('*a') or ''):match('^%s*(.-)%s*$')
    f:close()
    if t ~= '' then return t, ("the token file '%s'"):format(s.token_path) end
  end
end

local function is_commit(rev) return #rev == 40 and rev:match('^%x+$') ~= nil end

local function quote_url(s, keep_slash)
  return (s:gsub('[^%w%-%._~' .. (keep_slash and '/' or '') .. ']', function(c) return ('%%%02X'):format(c:byte()) end))
end

-- hub.is_repo_id(name) -> whether name has the form of a Hub repository id:
-- 'name' or 'org/name', letters, digits, '-', '_' and '.', neither '--' nor
-- '..', at most 96 characters
function hub.is_repo_id(name)
  if type(name) ~= 'string' or #name == 0 or #name > 96 then return false end
  if name:find('%-%-') or name:find('%.%.') then return false end
  local a, b = name:match('^([%w%-_.]+)/([%w%-_.]+)$')
  if not a then a = name:match('^[%w%-_.]+$') end
  if not a then return false end
  return not (name:match('^[%-.]') or name:match('[%-.]$'))
end

-- hub.repo_folder(repo_id, cache_dir) -> the repository's folder in the cache
function hub.repo_folder(repo_id, cache_dir)
  return (cache_dir or hub.settings().cache_dir) .. '/models--' .. repo_id:gsub('/', '--')
end

local function host_of(url) return url:match('^(%a[%w+.-]*://[^/]+)') end

local function headers_for(url, session)
  local h = {'Accept-Encoding: identity', 'User-Agent: anatomy/' .. torch.version.anatomy}
  -- the token goes to the endpoint only, never to a host a redirect names
  if session.token and host_of(url) == host_of(session.endpoint) then
    h[#h + 1] = 'Authorization: Bearer ' .. session.token
  end
  return h
end

local function reach_error(session, url, r)
  local hint = ''
  if not session.offline then
    hint = '; with the files already in the cache, HF_HUB_OFFLINE=1 uses them without asking the Hub'
  end
  return ('cannot reach %s (%s)%s'):format(url, r.error, hint)
end

local function login_hint(session)
  return ('log in with `hf auth login` (or `huggingface-cli login`), or set HF_TOKEN%s'):format(
    session.token_source and (' (sent: ' .. session.token_source .. ')') or '')
end

-- An answer's refusal in words: 401 (no or a bad token), 403 (no access), 404.
local function refusal(session, r, what)
  local code = r.headers['x-error-code']
  if r.status == 401 then
    if session.token then
      return ('%s: the Hub refused the token from %s (401 Unauthorized): it is not valid for %s; %s'):format(
        what, session.token_source, session.repo_id, login_hint({}))
    end
    return ("%s: the Hub answered 401 Unauthorized: '%s' is gated or private (or does not exist), and no token was sent; %s"):format(
      what, session.repo_id, login_hint({}))
  elseif r.status == 403 then
    return ("%s: the token from %s has no access to '%s' (403 Forbidden): a gated model needs its terms accepted on %s/%s"):format(
      what, session.token_source or '(none)', session.repo_id, session.endpoint, session.repo_id)
  elseif r.status == 404 then
    if code == 'RevisionNotFound' then
      return ("%s: '%s' has no revision '%s' (404)"):format(what, session.repo_id, session.revision)
    elseif code == 'EntryNotFound' then
      return ("%s: '%s' at revision '%s' has no such file (404)"):format(what, session.repo_id, session.revision)
    end
    local message = r.body and r.body:match('"error"%s*:%s*"([^"]*)"') or ''
    if code == 'RepositoryNotFound' or (code == nil and session.revision == 'main' and message == '') then
      return ("%s: no repository '%s' on %s (404)"):format(what, session.repo_id, session.endpoint)
    end
    if message:match('^Invalid rev') or message:lower():find('revision', 1, true) then
      return ("%s: '%s' has no revision '%s' (404: %s)"):format(what, session.repo_id, session.revision, message)
    end
    -- a 404 that does not say what is missing: name both, claim neither
    return ("%s: the Hub answered 404 for '%s' at revision '%s' without saying whether the repository or the revision is "
      .. "missing%s"):format(what, session.repo_id, session.revision, message ~= '' and (' (' .. message .. ')') or '')
  end
  local message = r.body and r.body:match('"error"%s*:%s*"([^"]*)"') or ''
  return ('%s: the Hub answered %d%s'):format(what, r.status, message ~= '' and (' (' .. message .. ')') or '')
end

-- One request; relative redirects (a renamed repository) are followed, and
-- with req.follow absolute ones too (a download's storage hosts); otherwise
-- an absolute one (the CDN an LFS file is on) is returned to the caller. The
-- token goes with each hop only when it is to the endpoint (headers_for).
local function request(session, req)
  local follow = req.follow
  req.follow = nil
  for _ = 1, 6 do
    req.headers = headers_for(req.url, session)
    local r = torch._http(req)
    local location = r.headers.location
    if r.status >= 300 and r.status < 400 and location and (location:sub(1, 1) == '/' or follow) then
      req.url = location:sub(1, 1) == '/' and (host_of(req.url) .. location) or location
    else
      r.url = req.url
      return r
    end
  end
  error(('%s: too many redirects from %s'):format(session.where, req.url), 0)
end

local function normalize_etag(e)
  if not e then return nil end
  return (e:gsub('^W/', ''):gsub('^"(.*)"$', '%1'))
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
  }
  session.token, session.token_source = find_token(opts, s)
  session.repo = hub.repo_folder(repo_id, session.cache_dir)
  local snap = setmetatable({repo_id = repo_id, revision = revision, session = session}, Snapshot)
  if session.offline then
    local why = s.offline and 'HF_HUB_OFFLINE=1' or 'local_files_only'
    local commit = revision
    if not is_commit(revision) then
      local ref = session.repo .. '/refs/' .. revision
      local f = io.open(ref, 'rb')
      if not f then
        error(("%s: %s, and revision '%s' of '%s' is not in the cache (no %s)"):format(where, why, revision, repo_id, ref), 0)
      end
      commit = (f:read('*a') or ''):match('^%s*(%x+)%s*$') or ''
      f:close()
      if not is_commit(commit) then error(("%s: %s holds no commit id"):format(where, ref), 0) end
    end
    snap.commit = commit
    snap.folder = session.repo .. '/snapshots/' .. commit
    if not fs.is_dir(snap.folder) then
      error(("%s: %s, and commit %s of '%s' is not in the cache (no %s)"):format(where, why, commit, repo_id, snap.folder), 0)
    end
    return snap
  end
  local url = ('%s/api/models/%s/revision/%s'):format(s.endpoint, repo_id, quote_url(revision))
  local r = request(session, {method = 'GET', url = url})
  if r.error then error(('%s: %s'):format(where, reach_error(session, url, r)), 0) end
  if r.status ~= 200 then error(refusal(session, r, where), 0) end
  local ok, info = pcall(json.decode, r.body)
  if not ok or type(info) ~= 'table' or type(info.sha) ~= 'string' or not is_commit(info.sha) then
    error(('%s: %s did not answer with a commit id (sha)'):format(where, url), 0)
  end
  snap.commit = info.sha
  snap.folder = session.repo .. '/snapshots/' .. info.sha
  snap.files = {}
  for _, sibling in ipairs(type(info.siblings) == 'table' and info.siblings or {}) do
    if type(sibling.rfilename) == 'string' then snap.files[#snap.files + 1] = sibling.rfilename end
  end
  table.sort(snap.files)
  snap._listed = {}
  for _, f in ipairs(snap.files) do snap._listed[f] = true end
  if revision ~= info.sha then fs.write_atomic(session.repo .. '/refs/' .. revision, info.sha) end
  return snap
end

-- snapshot:has(file) -> whether the revision has the file (offline: whether
-- the cache has it)
function Snapshot:has(file)
  if self._listed then return self._listed[file] == true end
  return fs.exists(self.folder .. '/' .. file)
end

local function check_digest(path, etag, size, label, where)
  local have = torch._file_size(path)
  if size and have ~= size then
    os.remove(path)
    error(('%s: the download of %s has %d bytes, the Hub said %d; removed, try again'):format(where, label, have, size), 0)
  end
  local kind = (#etag == 64 and etag:match('^%x+$')) and 'sha256' or (#etag == 40 and etag:match('^%x+$')) and 'git-sha1'
  if not kind then return end  -- an ETag of no known form: the size was checked
  local digest = torch._file_digest(path, kind)
  if digest ~= etag:lower() then
    os.remove(path)
    error(('%s: the download of %s has %s %s, the Hub said %s; removed, try again'):format(
      where, label, kind == 'sha256' and 'SHA-256' or 'git blob id', digest, etag), 0)
  end
end

-- Fetches a blob into blobs/<etag>, holding its lock: continued from its
-- .incomplete part, retried after a cut, checked, then renamed into place.
local function fetch_blob(session, url, etag, size, blob, label)
  local locks = session.cache_dir .. '/.locks/models--' .. session.repo_id:gsub('/', '--')
  fs.mkdir(locks)
  fs.mkdir(fs.dirname(blob))
  local lock = torch._lock(locks .. '/' .. etag .. '.lock', label)
  local ok, err = pcall(function()
    if fs.exists(blob) then return end  -- another process fetched it while we waited
    local part = blob .. '.incomplete'
    local tries = 0
    while true do
      local have = torch._file_size(part) or 0
      if size and have > size then os.remove(part); have = 0 end
      local r
      if size and have == size then
        r = {status = 200, headers = {}}
      else
        r = request(session, {method = 'GET', url = url, output = part, resume_from = have > 0 and have or nil,
          progress = label, total = size, follow = true})
      end
      if not r.error and r.status >= 200 and r.status < 300 then break end
      if r.status == 416 and size and (torch._file_size(part) or 0) == size then break end
      tries = tries + 1
      if not r.error or tries >= 5 then
        if r.error then error(('%s: %s (after %d tries; %s kept to continue from)'):format(session.where,
          reach_error(session, url, r), tries, part), 0) end
        error(refusal(session, r, session.where .. ': ' .. label), 0)
      end
      io.stderr:write(('anatomy: %s: %s; continuing from byte %d\n'):format(label, r.error,
        torch._file_size(part) or 0))
    end
    check_digest(part, etag, size, label, session.where)
    local renamed, why = os.rename(part, blob)
    if not renamed then error(('%s: cannot move %s into place: %s'):format(session.where, part, tostring(why)), 0) end
  end)
  lock:release()
  if not ok then error(err, 0) end
end

-- snapshot:fetch(file) -> the file's path in the snapshot folder, fetched
-- from the Hub when the cache lacks it
function Snapshot:fetch(file)
  local session = self.session
  local path = self.folder .. '/' .. file
  if fs.exists(path) then return path end
  if session.offline then
    error(("%s: HF_HUB_OFFLINE=1 (or local_files_only), and the cache lacks %s of '%s' at %s (no %s)"):format(
      session.where, file, self.repo_id, self.commit, path), 0)
  end
  local label = self.repo_id .. ' ' .. file
  local url = ('%s/%s/resolve/%s/%s'):format(session.endpoint, self.repo_id, self.commit, quote_url(file, true))
  local r = request(session, {method = 'HEAD', url = url})
  if r.error then error(('%s: %s'):format(session.where, reach_error(session, url, r)), 0) end
  if r.status >= 400 then
    session.revision = self.revision
    error(refusal(session, r, session.where .. ': ' .. file), 0)
  end
  local etag = normalize_etag(r.headers['x-linked-etag'] or r.headers.etag)
  if not etag or etag == '' or etag:find('[/\\]') then
    error(('%s: %s answered without an ETag for %s'):format(session.where, url, file), 0)
  end
  local size = tonumber(r.headers['x-linked-size'] or (r.status < 300 and r.headers['content-length']) or '')
  local from = (r.status >= 300 and r.headers.location) or r.url
  local blob = session.repo .. '/blobs/' .. etag
  if not fs.exists(blob) then fetch_blob(session, from, etag, size, blob, label) end
  fs.mkdir(fs.dirname(path))
  local _, depth = file:gsub('/', '')
  torch._symlink(('../'):rep(depth + 2) .. 'blobs/' .. etag, path)
  return path
end

-- hub.hf_hub_download(repo_id, filename, {revision, token, cache_dir,
-- local_files_only}) -> the file's path in the cache (as huggingface_hub's)
function hub.hf_hub_download(repo_id, filename, opts)
  opts = options.check(opts, {revision = true, token = true, cache_dir = true, local_files_only = true},
    'hub.hf_hub_download', 2)
  if type(filename) ~= 'string' or filename == '' then
    error(('hub.hf_hub_download: filename must be a string, got %s'):format(type(filename)), 0)
  end
  opts.where = 'hub.hf_hub_download'
  local snap = hub.open(repo_id, opts)
  if not snap:has(filename) then
    error(("hub.hf_hub_download: '%s' at revision '%s' has no file %s"):format(repo_id, snap.revision, filename), 0)
  end
  return snap:fetch(filename)
end

-- The tokenizer files the loaders read, whichever of them a repository has.
hub.tokenizer_files = {'tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json', 'vocab.json', 'merges.txt',
  'tokenizer.model'}

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
      if type(file) ~= 'string' or file:find('%.%.') or file:sub(1, 1) == '/' then
        error(("%s: %s's index names a shard '%s' outside the repository"):format(where, describe(snap), tostring(file)), 0)
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
    local target = torch._readlink(snap.folder .. '/' .. f)
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
  local session = {repo_id = repo_id, revision = 'main', where = where, endpoint = s.endpoint}
  session.token, session.token_source = find_token(opts, s)
  local url = ('%s/api/models/%s/refs'):format(s.endpoint, repo_id)
  local r = request(session, {method = 'GET', url = url})
  if r.error then error(('%s: %s'):format(where, reach_error(session, url, r)), 0) end
  if r.status ~= 200 then error(refusal(session, r, where), 0) end
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
