-- experiment: what the examples share: a config with --smoke, the text their
-- claims were made on (found, checked by its SHA-256, never silently
-- replaced), the table that sets a published claim beside our measurement
-- with a verdict, and sweeps over a grid of settings.
local torch = require('anatomy.torch')
local native = require('anatomy.torch.native')
local data = require('anatomy.data')
local provenance = require('anatomy.io.provenance')
local fs = require('anatomy.io.fs')

local experiment = {}

experiment.Results = require 'anatomy.experiment.results'
experiment.Sweep = require 'anatomy.experiment.sweep'

-- The texts claims were made on, known by content: a file is that text when
-- its SHA-256 matches, whatever its name or folder.
experiment.datasets = {
  tinyshakespeare = {name = 'Tiny Shakespeare', file = 'tinyshakespeare.txt', bytes = 1115394,
    sha256 = '86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed'},
}

-- experiment.config(defaults, smoke, args, usage): torch.config.parse plus smoke = false;
-- with --smoke=true, `smoke` overrides (a few steps) are applied.
function experiment.config(defaults, smoke, args, usage)
  defaults.smoke = false
  local cfg = torch.config.parse(defaults, args, usage)
  if cfg.smoke then for k, v in pairs(smoke or {}) do cfg[k] = v end end
  -- the script is a smoke run: experiment.results' verdicts then say 'smoke run: not meaningful'
  experiment.smoke = cfg.smoke == true
  -- the commit is read now, before the run writes anything: a script that
  -- writes its results into the checkout (examples/results/) would otherwise
  -- find its own new charts there and call the tree it ran from dirty
  provenance.commit()
  return cfg
end

local exists = fs.exists

-- The repository root above a file: the nearest folder holding lua/anatomy/init.lua.
local function root_above(path)
  local dir = path and native.data.realpath(path)
  while dir and dir ~= '' do
    dir = dir:match('^(.*)/[^/]*$')
    if dir and exists(dir .. '/lua/anatomy/init.lua') then return dir end
  end
end

-- Folders searched before all others (empty unless a script or a test adds some).
experiment.data_path = {}

-- experiment.data_dirs([script]) -> the folders searched for a dataset, in
-- order: experiment.data_path, $ANATOMY_DATA, then shared/data inside and
-- beside the repository root of the script (found from its absolute path,
-- not the current folder), then the same for the source tree this library
-- runs from.
function experiment.data_dirs(script)
  local dirs, seen = {}, {}
  local function add(d) if d and not seen[d] then seen[d] = true; dirs[#dirs + 1] = d end end
  for _, d in ipairs(experiment.data_path) do add(d) end
  local env = os.getenv('ANATOMY_DATA')
  if env and env ~= '' then add(env) end
  for _, root in ipairs{root_above(script or (arg and arg[0])) or false, provenance.source_root() or false} do
    if root then
      add(root .. '/shared/data')
      add((root:match('^(.*)/[^/]*$') or '') .. '/shared/data')
    end
  end
  return dirs
end

-- experiment.find_data(name[, script]) -> path or nil, the folders looked in
-- name: a key of experiment.datasets (its file name is looked for).
function experiment.find_data(name, script)
  local ds = assert(experiment.datasets[name], 'unknown dataset ' .. tostring(name))
  local dirs = experiment.data_dirs(script)
  for _, d in ipairs(dirs) do
    local p = d .. '/' .. ds.file
    if exists(p) then return p, dirs end
  end
  return nil, dirs
end

-- experiment.corpus(cfg, opts) -> corpus, data
-- The text an experiment runs on. cfg.data = '' means the dataset its claims
-- were made on (opts.dataset, default 'tinyshakespeare'), found by
-- experiment.find_data and checked by SHA-256; when it is missing the script
-- stops with an error saying where it looked, except in a smoke run, which
-- may use the default corpus. cfg.data = PATH runs on that file; unless it is
-- the dataset (same SHA-256), every verdict reads 'not comparable (data: NAME)'.
-- opts: data.text's options, plus dataset. data = {dataset, comparable, name, path, sha256, note}.
function experiment.corpus(cfg, opts)
  opts = opts or {}
  local key = opts.dataset or 'tinyshakespeare'
  local ds = assert(experiment.datasets[key], 'experiment.corpus: unknown dataset ' .. tostring(key))
  local text_opts = {}
  for k, v in pairs(opts) do if k ~= 'dataset' then text_opts[k] = v end end
  local script = arg and arg[0] or 'this experiment'
  local path, found_by, checked  -- checked: the file's facts when the search already hashed it
  if cfg.data and cfg.data ~= '' then
    path, found_by = cfg.data, '--data'
    if not exists(path) then error(("%s: cannot open --data=%s"):format(script, path), 0) end
  else
    local dirs
    path, dirs = experiment.find_data(key)
    found_by = 'search'
    if path then
      checked = data.file_info(path)
      local info = checked
      if info.sha256 ~= ds.sha256 then
        error(("%s: %s is not %s (sha256 %s, expected %s)\n---> HINT: pass --data=%s to run on it anyway; its verdicts then read 'not comparable'")
          :format(script, info.path, ds.name, info.sha256, ds.sha256, info.path), 0)
      end
    elseif cfg.smoke then
      path, found_by = data.default_text(), 'smoke'
    else
      local looked = {}
      for i, d in ipairs(dirs) do looked[i] = '  ' .. d .. '/' .. ds.file end
      error(("%s: the claims of this experiment were made on %s (%s), which was not found; looked in:\n%s%s\n"
        .. "---> HINT: --data=PATH/%s, or ANATOMY_DATA=FOLDER holding %s. Another text runs only when named with --data, "
        .. "and its verdicts then read 'not comparable'")
        :format(script, ds.name, ds.file, table.concat(looked, '\n'),
          (os.getenv('ANATOMY_DATA') or '') == '' and '\n  ($ANATOMY_DATA is not set)' or '', ds.file, ds.file), 0)
    end
  end
  local corpus = data.text(path, text_opts)
  corpus._file_info = checked
  local info = corpus:file_info()
  local d = {dataset = ds.name, comparable = info.sha256 == ds.sha256, name = info.name, path = info.path, sha256 = info.sha256}
  if d.comparable then
    d.note = ('data: %s (%s, sha256 %s)'):format(info.path, ds.name, info.sha256:sub(1, 16))
  else
    d.note = ("data: %s (%s; not %s, on which the claims were made: every verdict reads 'not comparable')")
      :format(info.path, found_by == 'smoke' and 'smoke run on the default corpus' or 'given with --data', ds.name)
  end
  print(d.note)
  return corpus, d
end

-- experiment.verdict(ours, low, high): 'reproduced' inside [low, high], 'differs' otherwise
function experiment.verdict(ours, low, high)
  if ours == nil or ours ~= ours then return 'not measured' end
  if ours >= low and ours <= high then return 'reproduced' end
  return 'differs'
end

-- experiment.results(title, data) -> a Results table of {claim, published,
-- ours, verdict} rows; data (from experiment.corpus) decides whether the
-- verdicts stand or read 'not comparable (data: NAME)'.
function experiment.results(title, data_)
  return experiment.Results.new(title, data_, experiment.smoke)
end

-- experiment.sweep(grid, fn[, opts]) -> a Sweep: fn(cfg) for every combination
-- of the grid's values (see experiment/sweep.lua).
function experiment.sweep(grid, fn, opts)
  return experiment.Sweep.run(grid, fn, opts)
end

return experiment
