-- provenance: the one record that says where a result came from — the data
-- (path, size, SHA-256, tokenizer), the model and its training, the software
-- (LibTorch, commit) and the machine — so that a number can be checked and
-- rerun. Every writer of results (examples, scripts, the autopsy's JSON and
-- report) builds its record here; render/provenance.lua writes it as text
-- (provenance.line, provenance.fields).
local torch = require('anatomy.torch')
local natives = require('anatomy.torch.native')
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')

local provenance = {}
local native = require('anatomy.torch.native').data
-- When the library was loaded: the start of the script, near enough. A
-- record's wall time counts from here unless told otherwise.
provenance.started = natives.now()
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
function provenance.file(path)
  local info = native.file_info(path)
  info.name = info.path:match('([^/]+)$')
  return info
end

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
  local class = getmetatable(model) and getmetatable(model).__typename  -- nn.class's name (io stands below nn)
  return {class = class or type(model), config = plain(rawget(model, 'config')), parameters = model:num_parameters(),
    dtype = first and first.dtype or nil, device = first and first.device or nil,
    source = rawget(model, 'hf_source') and plain(rawget(model, 'hf_source')) or nil}
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
    wall_seconds = natives.now() - (spec.started or provenance.started),
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

-- provenance.json(record) -> the record as a JSON string
function provenance.json(rec) return json.encode(rec) end

return provenance
