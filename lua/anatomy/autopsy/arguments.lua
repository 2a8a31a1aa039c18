-- arguments: what autopsy.run is given, checked before anything runs: a
-- corpus's tokens against the model's, a list of texts padded into one
-- batch, the saes, lens and history options. Errors are at the level of
-- autopsy.run's caller.
local torch = require('anatomy.torch')
local probe = require('anatomy.probe')
local nn = require('anatomy.nn')
local measure = require('anatomy.autopsy.measure')
local data = require('anatomy.data')
local inputs = require('anatomy.probe.inputs')
local format = require('anatomy.render.format')
local lens_module = require('anatomy.probe.lens')
local args = {}

-- A corpus whose ids are not the model's tokens gives numbers that look
-- fine and mean nothing: a model with its own tokenizer (a pretrained
-- checkpoint) takes only a corpus read with that tokenizer.
function args.check_tokens(model, source)
  local mine = rawget(model, 'tokenizer')
  if not mine or getmetatable(source) ~= data.Corpus then return end
  local theirs = rawget(source, 'read_with')
  if theirs and (theirs == mine or (theirs.path == mine.path and theirs.vocab_size == mine.vocab_size)) then return end
  error(("autopsy.run: the corpus %s was read with %s, and the model reads with its own tokenizer (%s, %d tokens): its ids "
    .. "would be other tokens; read the text with data.text(path, {tokenizer = model.tokenizer})"):format(tostring(source.source),
    theirs and ("the tokenizer of '%s' (%d tokens)"):format(tostring(theirs.path), theirs.vocab_size)
      or ('a %s tokenizer of %d tokens'):format(tostring(source.tokenizer), source.vocab_size),
    tostring(mine.path), mine.vocab_size), 3)
end

-- A list of texts (or of 1-D ids) of any lengths as one batch: each
-- example predicts its own next tokens (inputs without the last token,
-- targets without the first), padded on the right with one mask for both.
-- nil for any other source.
function args.padded_source(model, source, opts)
  if type(source) ~= 'table' or getmetatable(source) ~= nil then return nil end
  local first = source[1]
  if not (type(first) == 'string' or (torch.is_tensor(first) and first:dim() == 1)) then return nil end
  local where = 'autopsy.run'
  local tok = opts.tokenizer or rawget(model, 'tokenizer')
  local xs, ys = {}, {}
  for i, t in ipairs(source) do
    local ids
    if type(t) == 'string' then
      if not tok then error(('%s: texts need a tokenizer: pass {tokenizer = tok}, or use a model from models.from_pretrained'):format(where), 3) end
      ids = tok:encode(t)
    elseif torch.is_tensor(t) and t:dim() == 1 and t.dtype == 'int64' then
      ids = t
    else
      error(('%s: data[%d] must be a text or 1-D int64 ids, as data[1] is, got %s'):format(where, i,
        torch.is_tensor(t) and (t.dtype .. ' ' .. format.shape(t)) or type(t)), 3)
    end
    if ids:numel() < 2 then error(('%s: data[%d] has %d token(s): nothing to predict'):format(where, i, ids:numel()), 3) end
    xs[i], ys[i] = ids:narrow(1, 1, ids:numel() - 1), ids:narrow(1, 2, ids:numel() - 1)
  end
  local x, _, mask = inputs.to_ids(model, xs, nil, where)
  local y = inputs.to_ids(model, ys, nil, where)
  local dev = model:device()
  local out = {x:to(dev), y:to(dev)}
  if mask then
    out.mask = mask:to(dev)
    local idx = {}
    for k, real in ipairs(mask:reshape(-1):tolist()) do if real then idx[#idx + 1] = k end end
    out.idx = torch.tensor(idx, {dtype = 'int64', device = dev})
  end
  return out
end

-- The saes option: SAEs (sae.train, sae.load) each at a point inside one
-- block, or CLTs of as many layers as the model; checked before anything
-- runs. Returns each SAE with its block's row name, a CLT once a layer.
function args.check_saes(model, saes, source)
  if saes == nil then return nil end
  if type(saes) ~= 'table' or #saes == 0 then error(('autopsy.run: saes must be a list of SAEs, got %s'):format(type(saes)), 3) end
  if getmetatable(source) ~= data.Corpus then
    error('autopsy.run: saes are evaluated on the corpus\'s val split; give a corpus as the data', 3)
  end
  local layers = measure.layers(model)
  local out = {}
  for i, s in ipairs(saes) do
    if nn.typename(s) == 'sae.CLT' then  -- a row for each of its layers
      if s.cfg.n_layers ~= #layers then
        error(('autopsy.run: saes[%d] is a CLT of %d layers, and the model has %d'):format(i, s.cfg.n_layers, #layers), 3)
      end
      for l, layer in ipairs(layers) do out[#out + 1] = {clt = s, layer = l, row = layer[1]} end
      goto continue
    end
    if type(s) ~= 'table' or not s.cfg or not s.encode then
      error(('autopsy.run: saes[%d] must be an SAE (sae.train, sae.load), got %s'):format(i, nn.typename(s)), 3)
    end
    local point = s.cfg.point and probe.canonical(model, s.cfg.point)
    if not point then error(('autopsy.run: saes[%d] names no point of this model (%s)'):format(i, tostring(s.cfg.point)), 3) end
    local row
    for _, l in ipairs(layers) do
      if point == l[1] or point:sub(1, #l[1] + 1) == l[1] .. '.' then row = l[1] end
    end
    if not row then
      local names = {}
      for j, l in ipairs(layers) do names[j] = l[1] end
      error(('autopsy.run: saes[%d] reads %s, inside none of the layers (%s)'):format(i, point, table.concat(names, ', ')), 3)
    end
    out[#out + 1] = {sae = s, row = row}
    ::continue::
  end
  return out
end

-- The lens option: a tuned lens of this very model (a logit lens adds
-- nothing: lens_loss is the logit lens already).
function args.check_lens(model, l)
  if l == nil then return end
  if getmetatable(l) ~= lens_module.Lens then
    error(('autopsy.run: lens must be a lens from lens.tuned or lens.load, got %s'):format(type(l)), 3)
  end
  if l.kind ~= 'tuned' then
    error('autopsy.run: lens is a logit lens, which the autopsy reads already (lens_loss); pass a tuned lens (lens.tuned, lens.load)', 3)
  end
  if l.model ~= model then
    error(('autopsy.run: lens was made for another model (%s), not this %s'):format(tostring(l.model_name), nn.typename(model)), 3)
  end
end

-- The history option: a train.fit run as it is, or the records of
-- train.read_metrics (a log written by train.fit) as the run's losses.
function args.history_of(h)
  local where = 'autopsy.run'
  if type(h) ~= 'table' then
    error(('%s: history must be the run train.fit returned, or train.read_metrics(path)\'s records, got %s'):format(where, type(h)), 3)
  end
  if type(h.train) == 'table' then return h end
  if type(h[1]) ~= 'table' or type(h[1].step) ~= 'number' or type(h[1].loss) ~= 'number' then
    error(('%s: history must be the run train.fit returned (with .train), or train.read_metrics(path)\'s records ({step, loss, ...}); '
      .. 'got a table without either'):format(where), 3)
  end
  local out = {train = {}, val = {}, first_step = h[1].step, steps = h[#h].step}
  for i, r in ipairs(h) do
    if r.step ~= h[1].step + i - 1 then
      error(('%s: history: record %d is step %s, expected %d (the log of one run, a record a step)'):format(where, i, tostring(r.step),
        h[1].step + i - 1), 3)
    end
    out.train[i] = r.loss
    if type(r.val_loss) == 'number' then out.val[#out.val + 1] = {step = r.step, loss = r.val_loss} end
  end
  return out
end

return args
