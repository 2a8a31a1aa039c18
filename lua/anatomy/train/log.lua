-- train.log: the JSON-lines log train.fit writes ({log = path}), one record
-- a step: reading it back (train.read_metrics), keeping it whole across a
-- resume, and exporting it as CSV or TensorBoard scalars (train.export_metrics).
local native = require('anatomy.torch.native')
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')
local options = require('anatomy.torch.options')
local export = require('anatomy.io.export')
local log = {}

-- train.read_metrics(path) -> {record, ...}: the JSON-lines log train.fit
-- writes ({log = path}), one table a line. A last line cut short (a run
-- killed mid-write) is skipped with a warning on stderr; any other line that
-- is not a JSON object is an error naming the file and the line.
function log.read(path)
  if type(path) ~= 'string' then error(('train.read_metrics: path must be a string, got %s'):format(type(path)), 2) end
  local why = native.not_a_file(path)  -- a directory opens, then reads as nil
  if why then error(("train.read_metrics: '%s' %s"):format(path, why), 2) end
  local f, err = io.open(path, 'rb')
  if not f then error(('train.read_metrics: cannot open %s'):format(tostring(err)), 2) end
  local text = f:read('*a')
  f:close()
  local records, n = {}, 0
  local lines = {}
  for line in text:gmatch('([^\n]*)\n') do lines[#lines + 1] = line end
  local tail = text:match('[^\n]*$')
  if tail ~= '' then lines[#lines + 1] = tail end
  for i, line in ipairs(lines) do
    if line:match('%S') then
      local ok, rec = pcall(json.decode, line)
      if ok and type(rec) == 'table' then
        n = n + 1
        records[n] = rec
      elseif i == #lines and tail ~= '' then
        io.stderr:write(('train.read_metrics: %s: the last line (%d) is cut short and was skipped\n'):format(path, i))
      else
        error(('train.read_metrics: %s: line %d is not a JSON object: %s'):format(path, i,
          ok and type(rec) or tostring(rec):gsub('^[^:]*:%d+: ', '')), 2)
      end
    end
  end
  return records
end

-- log.open(path, resumed_from) -> file to append to (train.fit's). A fresh run
-- (resumed_from nil) starts the log anew; a resumed run keeps the records of
-- the steps up to its checkpoint and drops the rest (the steps run after it by
-- the killed process, and a last line cut short), so the log of a run that was
-- killed and resumed reads as the log of one uninterrupted run.
function log.open(path, resumed_from)
  local kept = {}
  if resumed_from and fs.exists(path) then
    for line in fs.read(path):gmatch('[^\n]+') do
      local ok, rec = pcall(json.decode, line)
      if ok and type(rec) == 'table' and type(rec.step) == 'number' and rec.step <= resumed_from then
        kept[#kept + 1] = line .. '\n'
      end
    end
  end
  fs.write_atomic(path, table.concat(kept))
  local f, err = io.open(path, 'a')
  if not f then error(('train.fit: cannot open the log %s'):format(tostring(err)), 3) end
  return f
end

-- train.export_metrics(path, {csv = file, tensorboard = folder}) -> what was
-- written: the JSON-lines log train.fit writes ({log = path}), as CSV (one
-- row a step: step, loss, lr, grad_norm, val_loss, tokens_per_second, time)
-- and as TensorBoard scalars (train/loss, train/lr, train/grad_norm,
-- train/tokens_per_second, val/loss, by step).
function log.export(path, opts)
  opts = options.check(opts, {'csv', 'tensorboard'}, 'train.export_metrics', 2)
  if not opts.csv and not opts.tensorboard then
    error('train.export_metrics: say where: {csv = file} and/or {tensorboard = folder}', 2)
  end
  local records = log.read(path)
  local written = {}
  if opts.csv then
    written.csv = export.csv(opts.csv, records, {'step', 'loss', 'lr', 'grad_norm', 'val_loss', 'tokens_per_second', 'time'})
  end
  if opts.tensorboard then
    local scalars = {}
    local last = records[#records]
    local ended = os.time()
    local tags = {{'loss', 'train/loss'}, {'lr', 'train/lr'}, {'grad_norm', 'train/grad_norm'},
                  {'tokens_per_second', 'train/tokens_per_second'}, {'val_loss', 'val/loss'}}
    for _, r in ipairs(records) do
      -- the log's time is seconds since the run began; TensorBoard wants the clock's
      local wall = (type(r.time) == 'number' and last and type(last.time) == 'number') and ended - (last.time - r.time) or nil
      for _, t in ipairs(tags) do
        if type(r[t[1]]) == 'number' and type(r.step) == 'number' then
          scalars[#scalars + 1] = {tag = t[2], step = r.step, value = r[t[1]], wall_time = wall}
        end
      end
    end
    fs.mkdir(opts.tensorboard)
    written.tensorboard = export.tensorboard(opts.tensorboard, scalars)
  end
  return written
end

return log
