-- provenance: the one record that says where a result came from — the data
-- (path, size, SHA-256, tokenizer), the model and its training, the software
-- (LibTorch, commit) and the machine — so that a number can be checked and
-- rerun. Every writer of results (examples, scripts, the autopsy's JSON and
-- report) builds its record here.
local nn = require('anatomy.nn')
local format = require('anatomy.render.format')
local json = require('anatomy.io.json')
local data = require('anatomy.data')
local fs = require('anatomy.io.fs')

local provenance = {}
local native = torch._data

-- When the library was loaded: the start of the script, near enough. A
-- record's wall time counts from here unless told otherwise.
provenance.started = torch._now()
provenance.started_utc = os.date('!%Y-%m-%dT%H:%M:%SZ')

-- A file's bytes, or nil where it cannot be read (/proc and /etc differ between systems).
local function read_file(path)
  local ok, s = pcall(fs.read, path)
  return ok and s or nil
end

local function command_output(cmd)
  local pipe = io.popen(cmd .. ' 2>/dev/null')
  if not pipe then return nil end
  local out = pipe:read('*a') or ''
  pipe:close()
  out = out:gsub('%s+$', '')
  return out ~= '' and out or nil
end

-- provenance.file(path) -> {name, path (absolute), bytes, sha256}; an error
-- naming the path when it cannot be read.
provenance.file = data.file_info

-- The source tree this library was loaded from (lua/anatomy/ inside it), or nil.
function provenance.source_root()
  local init = package.searchpath and package.searchpath('anatomy.init', package.path)
  if not init then return nil end
  local abs = native.realpath(init)
  return abs and abs:match('^(.*)/lua/anatomy/init%.lua$')
end

local cached_commit
-- provenance.commit() -> `git describe --always --dirty` of the checkout the
-- library runs from, else 'anatomy VERSION' (an installed copy).
function provenance.commit()
  if cached_commit then return cached_commit end
  local root = provenance.source_root()
  local top = root and command_output('git -C ' .. fs.quote(root) .. ' rev-parse --show-toplevel')
  if top and native.realpath(top) == root then
    cached_commit = command_output('git -C ' .. fs.quote(root) .. ' describe --always --dirty --abbrev=12')
  end
  cached_commit = cached_commit or ('anatomy ' .. torch.version.anatomy)
  return cached_commit
end

local cached_machine
-- provenance.machine() -> {cpu = model name, cores = logical CPUs, os = name and kernel}
function provenance.machine()
  if cached_machine then return cached_machine end
  local cpuinfo = read_file('/proc/cpuinfo') or ''
  local cores = 0
  for _ in cpuinfo:gmatch('\nprocessor%s*:') do cores = cores + 1 end
  if cpuinfo:match('^processor%s*:') then cores = cores + 1 end
  local cpu = cpuinfo:match('model name%s*:%s*([^\n]+)') or command_output('uname -m') or 'unknown'
  local release = read_file('/etc/os-release') or ''
  local os_name = release:match('PRETTY_NAME="([^"]+)"') or 'unknown'
  local kernel = (read_file('/proc/sys/kernel/osrelease') or ''):gsub('%s+$', '')
  cached_machine = {cpu = cpu:gsub('%s+', ' '), cores = cores > 0 and cores or nil,
    os = kernel ~= '' and (os_name .. ', Linux ' .. kernel) or os_name}
  return cached_machine
end

-- provenance.relative(path) -> path as a published record names it: relative
-- to the source tree when it lies inside it, else the file's name alone (its
-- bytes and SHA-256 beside it identify it); never the absolute path of the
-- machine that ran it.
function provenance.relative(path)
  if type(path) ~= 'string' or path:sub(1, 1) ~= '/' then return path end
  local root = provenance.source_root()
  local real = native.realpath(path) or path
  if root and real:sub(1, #root + 1) == root .. '/' then return real:sub(#root + 2) end
  return real:match('([^/]+)/?$') or real
end

-- provenance.data(corpus) -> {name, path (provenance.relative), bytes, sha256, tokenizer, vocab_size, tokens}
function provenance.data(corpus)
  local info = corpus:file_info()
  return {name = info.name, path = provenance.relative(info.path), bytes = info.bytes, sha256 = info.sha256,
    tokenizer = corpus.tokenizer, vocab_size = corpus.vocab_size,
    tokens = {train = corpus:size('train'), val = corpus:size('val')}}
end

local function plain(t)
  local out = {}
  for k, v in pairs(t or {}) do
    local kind = type(v)
    if kind == 'string' then out[k] = provenance.relative(v)  -- a --data=/abs/path given to a script
    elseif kind == 'number' or kind == 'boolean' then out[k] = v
    elseif kind == 'table' and not getmetatable(v) then out[k] = plain(v) end
  end
  return out
end

-- provenance.model(model) -> {class, config, parameters, dtype, device,
-- source}: source, for a checkpoint loaded by Hub name, is {repo_id,
-- revision, commit, weights} (the weights' content hashes)
function provenance.model(model)
  local first
  for _, p in model:named_parameters() do first = p break end
  return {class = nn.typename(model), config = plain(rawget(model, 'config')), parameters = model:num_parameters(),
    dtype = first and first.dtype or nil, device = first and first.device or nil,
    source = rawget(model, 'hf_source') and plain(rawget(model, 'hf_source')) or nil}
end

-- 'org/name at step1000 (commit 0123456789ab)' for a checkpoint loaded by name
local function source_text(src)
  if type(src) ~= 'table' or not src.repo_id then return '' end
  return (' from %s at %s%s'):format(src.repo_id, tostring(src.revision),
    src.commit and src.commit ~= src.revision and (' (commit ' .. src.commit:sub(1, 12) .. ')') or '')
end

-- ' on each of N ranks' for a data-parallel run's training record
local function ranks_text(t)
  local n = tonumber(t.world_size)
  return n and n > 1 and (' on each of %d ranks'):format(n) or ''
end

-- provenance.training(run) -> the settings and totals of a train.fit run
-- (steps, batch, seq, lr, schedule, warmup, weight decay, clip, seed, seconds)
function provenance.training(run)
  local out = {}
  for k, v in pairs(run.config or {}) do
    local key = k:match('^config%.(.*)$')
    if key then out[key] = v end
  end
  out.steps_run = run.steps
  out.seconds = run.seconds
  out.tokens_per_second = run.tokens_per_second
  out.final_train_loss = run.train[#run.train]
  out.final_val_loss = run.val[#run.val] and run.val[#run.val].loss or nil
  return out
end

-- provenance.record{corpus, model, run, runs = {{label, model, run}, ...}, config, started}
-- -> the record: data, model, training (or runs), config (the script's),
-- seed, threads, device, dtype, libtorch, cuda (the version LibTorch was built with, nil without), anatomy,
-- commit, machine, started, wall_seconds.
function provenance.record(spec)
  spec = spec or {}
  local rec = {
    anatomy = torch.version.anatomy, libtorch = torch.libtorch_version, cuda = torch.version.cuda, lua = jit and jit.version or _VERSION,
    threads = torch.get_num_threads(), device = torch.device(), commit = provenance.commit(),
    machine = provenance.machine(), started = spec.started_utc or provenance.started_utc,
    wall_seconds = torch._now() - (spec.started or provenance.started),
  }
  if spec.corpus then rec.data = provenance.data(spec.corpus) end
  if spec.model then rec.model = provenance.model(spec.model) end
  if spec.run then rec.training = provenance.training(spec.run) end
  if spec.runs then
    rec.runs = {}
    for i, r in ipairs(spec.runs) do
      rec.runs[i] = {label = r.label, model = r.model and provenance.model(r.model) or nil,
        training = r.run and provenance.training(r.run) or nil}
    end
  end
  if spec.config then rec.config = plain(spec.config) end
  local first = rec.model or (rec.runs and rec.runs[1] and rec.runs[1].model)
  rec.dtype = first and first.dtype or 'float32'
  if first and first.device then rec.device = first.device end
  local training = rec.training or (rec.runs and rec.runs[1] and rec.runs[1].training) or {}
  rec.seed = (spec.config and spec.config.seed) or training.seed
  return rec
end

local count = format.count

local function seconds(s)
  if s >= 90 then return ('%d min %d s'):format(math.floor(s / 60), math.floor(s % 60 + 0.5)) end
  return ('%.1f s'):format(s)
end

-- provenance.line(record) -> one line of prose with every field a reader needs
-- to rerun the result (the Markdown results and the report print it).
function provenance.line(rec)
  local parts = {}
  local d = rec.data
  if d then
    parts[#parts + 1] = ('data %s (%s bytes, sha256 %s), %s tokenizer, vocabulary %d'):format(
      d.path, count(d.bytes), d.sha256:sub(1, 16), d.tokenizer, d.vocab_size)
  end
  local models = {}
  if rec.model then models[1] = {model = rec.model, training = rec.training} end
  for _, r in ipairs(rec.runs or {}) do models[#models + 1] = r end
  for _, m in ipairs(models) do
    local t = m.training or {}
    local what = (m.label and (m.label .. ': ') or '') .. (m.model and (m.model.class .. ' ' .. count(m.model.parameters) .. ' parameters'
      .. source_text(m.model.source)) or '')
    if t.steps_run then
      what = what .. (', %d steps of batch %d x %d%s, lr %s'):format(t.steps_run, t.batch or 0, t.seq or 0, ranks_text(t), tostring(t.lr))
    end
    parts[#parts + 1] = what
  end
  if rec.seed then parts[#parts + 1] = 'seed ' .. tostring(rec.seed) end
  parts[#parts + 1] = ('%d thread%s, %s, %s'):format(rec.threads, rec.threads == 1 and '' or 's', rec.device, rec.dtype)
  parts[#parts + 1] = ('anatomy %s (%s), LibTorch %s'):format(rec.anatomy, rec.commit, rec.libtorch)
  local m = rec.machine or {}
  parts[#parts + 1] = ('%s, %s cores, %s'):format(m.cpu or '?', tostring(m.cores or '?'), m.os or '?')
  parts[#parts + 1] = ('started %s, wall time %s'):format(rec.started, seconds(rec.wall_seconds))
  return table.concat(parts, '; ')
end

-- provenance.fields(record) -> {{label, text}, ...}: the record as the
-- labelled lines the top of a report shows (model with its configuration,
-- data, training, device, software, machine, date)
function provenance.fields(rec)
  local out = {}
  local function config_text(cfg)
    local keys = {}
    for k, v in pairs(cfg or {}) do if type(v) ~= 'table' then keys[#keys + 1] = k end end
    table.sort(keys)
    local parts = {}
    for _, k in ipairs(keys) do parts[#parts + 1] = ('%s=%s'):format(k, tostring(cfg[k])) end
    return table.concat(parts, ', ')
  end
  local models = {}
  if rec.model then models[1] = {model = rec.model, training = rec.training} end
  for _, r in ipairs(rec.runs or {}) do models[#models + 1] = r end
  for _, m in ipairs(models) do
    local label = m.label and ('model (' .. m.label .. ')') or 'model'
    if m.model then
      local cfg = config_text(m.model.config)
      out[#out + 1] = {label, ('%s, %s parameters%s%s'):format(m.model.class, count(m.model.parameters), source_text(m.model.source),
        cfg ~= '' and ('; ' .. cfg) or '')}
    end
    local t = m.training
    if t and t.steps_run then
      out[#out + 1] = {m.label and ('training (' .. m.label .. ')') or 'training',
        ('%d steps of batch %s x %s%s, lr %s%s%s, %s; final train loss %s%s'):format(t.steps_run, tostring(t.batch or '?'),
          tostring(t.seq or '?'), ranks_text(t), tostring(t.lr), t.schedule and (', ' .. t.schedule .. ' schedule') or '',
          t.warmup and (', warmup ' .. t.warmup) or '', t.seconds and seconds(t.seconds) or '?',
          t.final_train_loss and ('%.4f'):format(t.final_train_loss) or '-',
          t.final_val_loss and (', val loss %.4f'):format(t.final_val_loss) or '')}
    end
  end
  local d = rec.data
  if d then
    out[#out + 1] = {'data', ('%s (%s bytes, sha256 %s), %s tokenizer, vocabulary %d, %s train + %s val tokens'):format(
      d.path, count(d.bytes), d.sha256, d.tokenizer, d.vocab_size, count(d.tokens and d.tokens.train or 0), count(d.tokens and d.tokens.val or 0))}
  end
  local trained = rec.training or (rec.runs and rec.runs[1] and rec.runs[1].training)
  out[#out + 1] = {'seed', rec.seed and tostring(rec.seed)
    or trained and 'not given (train.fit ran without a seed)' or 'none recorded (no training run in this record)'}
  out[#out + 1] = {'device', ('%s, %s, %d thread%s'):format(rec.device, rec.dtype, rec.threads, rec.threads == 1 and '' or 's')}
  out[#out + 1] = {'software', ('anatomy %s (commit %s), LibTorch %s%s, %s'):format(rec.anatomy, rec.commit, rec.libtorch,
    rec.cuda and (' (CUDA ' .. rec.cuda .. ')') or '', rec.lua)}
  local m = rec.machine or {}
  out[#out + 1] = {'machine', ('%s, %s cores, %s'):format(m.cpu or '?', tostring(m.cores or '?'), m.os or '?')}
  out[#out + 1] = {'date', ('%s, wall time %s'):format(rec.started, seconds(rec.wall_seconds))}
  return out
end

-- provenance.json(record) -> the record as a JSON string
function provenance.json(rec) return json.encode(rec) end

return provenance
