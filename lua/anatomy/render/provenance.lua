-- provenance (render): a provenance record (io/provenance.lua) as text: one
-- line of prose (provenance.line) and labelled fields (provenance.fields),
-- for the Markdown results, the scripts' last line and the report's header.
local format = require('anatomy.render.format')
local text = {}

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

local count = format.count

local function seconds(s)
  if s >= 90 then return ('%d min %d s'):format(math.floor(s / 60), math.floor(s % 60 + 0.5)) end
  return ('%.1f s'):format(s)
end

-- provenance.line(record) -> one line of prose with every field a reader needs
-- to rerun the result (the Markdown results and the report print it).
function text.line(rec)
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
function text.fields(rec)
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

return text
