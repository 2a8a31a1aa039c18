-- lens: what the model would predict if it stopped after each layer. The
-- residual stream before the first layer (row 'embed', layer 0) and after
-- each layer (rows 1..N) is read through the model's own head
-- (model:readout(h): the final norm and the unembedding).
--   lens.logit(model)                      the logit lens: each state as it is
--   lens.tuned(model, corpus, {...})       the tuned lens: an affine translator
--                                          per layer, trained (the model frozen)
--                                          so that its readout matches the final
--                                          distribution (smallest KL)
--   lens.load(model, path)                 translators saved by l:save(path)
-- A lens answers, for a text: l:trajectory(text) (entropy, KL to the final
-- distribution, rank of the final top token, per layer and position),
-- l:table(text, {k}) (the top-k tokens per layer and position; :svg() draws
-- it), l:evaluate(input) (per layer: mean KL and cross-entropy over the real
-- positions); the autopsy takes {lens = l}.
local torch = require('anatomy.torch')
local hooks = require('anatomy.probe.hooks')
local scope = require('anatomy.probe.scope')
local options = require('anatomy.torch.options')
local format = require('anatomy.render.format')
local nn = require('anatomy.nn')
local optim = require('anatomy.optim')
local lens_states = require('anatomy.probe.lens_states')
local views = require('anatomy.probe.lens_views')
local states, batch_of = lens_states.states, lens_states.batch_of

local lens = {}
local Lens = {}
Lens.__index = Lens
Lens.__typename = 'lens.Lens'
lens.Lens = Lens

-- The model's layers, checked for what a lens needs.
local function layers_of(model, where)
  if type(model) ~= 'table' or not nn.is_module(model) then
    error(('%s: model must be an nn.Module, got %s'):format(where, type(model)), 3)
  end
  local layers, why = model:layers()
  if not layers then error(('%s: %s'):format(where, why), 3) end
  if type(model.readout) ~= 'function' then
    error(('%s: %s has no readout(h) (its head applied to a hidden state), which a lens reads through'):format(
      where, nn.typename(model)), 3)
  end
  return layers
end

-- An argument of Lua type `kind` ('table', 'string'), or an error naming it.
local function argument(v, name, kind, where)
  if type(v) ~= kind then error(('%s: %s must be a %s, got %s'):format(where, name, kind, type(v)), 3) end
end

-- A positive whole number option (nil: the default).
local function whole(v, name, where, default)
  local r = options.whole(v, name, where, default, 1, 4)  -- 4: past this function (not a tail call) to its caller's caller
  return r
end

local function positive(v, name, where, default)
  if v == nil then return default end
  if type(v) ~= 'number' or v ~= v or v <= 0 or v == math.huge then
    error(('%s: %s must be a positive number, got %s'):format(where, name, tostring(v)), 3)
  end
  return v
end

-- The name a lens file records for the model: its Hub name, folder or class.
local function model_name(model)
  local src = rawget(model, 'hf_source')
  if type(src) == 'table' and src.repo_id then return src.repo_id end
  local folder = rawget(model, 'hf_folder')
  if type(folder) == 'string' then return folder:match('([^/]+)/*$') or folder end
  return nn.typename(model)
end

-- lens.weights_sha256(model) -> hex: the SHA-256 of the model's weights (their
-- names, dtypes, shapes and values; torch.tensors_sha256), which a saved lens records.
function lens.weights_sha256(model)
  local state = {}
  for name, p in model:named_parameters() do state[name] = p end
  return torch.tensors_sha256(state)
end

local function new(model, layers, kind)
  local names = {'embed'}
  for i, l in ipairs(layers) do names[i + 1] = l[1] end
  return setmetatable({model = model, kind = kind, names = names, translators = {}}, Lens)
end

-- lens.logit(model) -> the logit lens: row 0 ('embed', the first layer's
-- input) and each layer's output read through model:readout as they are.
function lens.logit(model)
  return new(model, layers_of(model, 'lens.logit'), 'logit')
end

-- l:readout(layer, h) -> logits: the hidden state h (..., C) of row `layer`
-- (0 = 'embed', the first layer's input; i = layer i's output) read through
-- the lens (the tuned lens translates it first).
function Lens:readout(layer, h)
  if type(layer) ~= 'number' or layer % 1 ~= 0 or layer < 0 or layer > #self.names - 1 then
    error(('lens:readout: layer must be 0 (embed) .. %d, got %s'):format(#self.names - 1, tostring(layer)), 2)
  end
  if not torch.is_tensor(h) then error(('lens:readout: h must be a Tensor, got %s'):format(type(h)), 2) end
  local w = self.model:parameters()[1]
  if w and (h.dtype ~= w.dtype or h.device ~= w.device) then
    error(('lens:readout: h is %s on %s, the model %s on %s (h:to(%s) converts it)'):format(h.dtype, h.device, w.dtype, w.device,
      h.device ~= w.device and ("'" .. w.device .. "'") or ("'" .. w.dtype .. "'")), 2)
  end
  local t = self.translators[layer]
  if t then
    if h:size(-1) ~= t.weight:size(1) then
      error(('lens:readout: h has %d features, the translator of %s %d'):format(h:size(-1), self.names[layer + 1], t.weight:size(1)), 2)
    end
    h = h + h:matmul(t.weight:t()) + t.bias
  end
  return self.model:readout(h)
end

-- KL(final || read) per position: (...) from logits (..., V).
local function kl(final_logp, read_logits)
  local lp = read_logits:log_softmax(-1)
  return (final_logp:exp() * (final_logp - lp)):sum(-1)
end
lens._kl = kl

-- l:evaluate(input, {tokenizer, padding_side}) -> {layers = names, kl = {...},
-- loss = {...}}: per row (embed, then each layer), the mean over real
-- positions of KL(final || lens) and of the cross-entropy of the lens's
-- prediction of the next token (the last position predicts nothing).
function Lens:evaluate(input, opts)
  local where = 'lens:evaluate'
  hooks.require_clean(self.model, where, 2)
  opts = options.check(opts, {'tokenizer', 'padding_side'}, where, 2)
  local ids, _, mask = batch_of(self, input, opts, where, 2)
  if ids:size(2) < 2 then error(('%s: the input needs 2 tokens or more (a next token to predict)'):format(where), 2) end
  local h, logits = states(self, ids, mask, where)
  local T = ids:size(2)
  local real = mask and mask:double() or torch.ones(ids:size(1), T, {dtype = 'float64', device = ids.device})
  local next_real = real:narrow(2, 1, T - 1) * real:narrow(2, 2, T - 1)
  local final_logp = logits:log_softmax(-1)
  local out = {layers = self.names, kl = {}, loss = {}}
  torch.no_grad(function()
    for i = 0, #self.names - 1 do
      local read = self:readout(i, h[i])
      out.kl[i + 1] = (kl(final_logp, read):double() * real):sum():item() / real:sum():item()
      local lp = read:narrow(2, 1, T - 1):log_softmax(-1)
      local nll = -lp:gather(3, ids:narrow(2, 2, T - 1):unsqueeze(3)):squeeze(3):double()
      out.loss[i + 1] = (nll * next_real):sum():item() / next_real:sum():item()
    end
  end)
  return out
end

-- lens.tuned(model, corpus, {steps = 500, batch = 8, seq, lr = 1e-3,
-- weight_decay = 0, seed = 0, split = 'train', quiet}) -> a tuned lens:
-- for row 0 and each layer but the last (whose readout is the model's
-- output), h -> h + W h + b with W and b zero at first (the identity),
-- trained together with AdamW to minimise the mean over positions of
-- KL(final || lens), summed over rows, on windows of corpus drawn with
-- the seed. The model is frozen (its gradients and mode restored after).
function lens.tuned(model, corpus, opts)
  local where = 'lens.tuned'
  hooks.require_clean(model, where, 2)
  local layers = layers_of(model, where)
  opts = options.check(opts, {'steps', 'batch', 'seq', 'lr', 'weight_decay', 'seed', 'split', 'quiet', 'log_every'}, where, 2)
  if type(corpus) ~= 'table' or type(corpus.batch) ~= 'function' then
    error(('%s: corpus must be a data corpus (data.text), got %s'):format(where, type(corpus)), 2)
  end
  local context = model:context()
  local cfg = {steps = whole(opts.steps, 'steps', where, 500), batch = whole(opts.batch, 'batch', where, 8),
    seq = whole(opts.seq, 'seq', where, math.min(context or 128, 128)), lr = positive(opts.lr, 'lr', where, 1e-3),
    weight_decay = opts.weight_decay or 0, seed = opts.seed or 0, split = opts.split or 'train'}
  if type(cfg.weight_decay) ~= 'number' or cfg.weight_decay ~= cfg.weight_decay or cfg.weight_decay < 0 then
    error(('%s: weight_decay must be a number >= 0, got %s'):format(where, tostring(opts.weight_decay)), 2)
  end
  if type(cfg.seed) ~= 'number' or cfg.seed % 1 ~= 0 then error(('%s: seed must be a whole number, got %s'):format(where, tostring(opts.seed)), 2) end
  if cfg.split ~= 'train' and cfg.split ~= 'val' then error(("%s: split must be 'train' or 'val', got %s"):format(where, tostring(opts.split)), 2) end
  if context and cfg.seq > context then error(('%s: seq %d is longer than the model\'s context (%d)'):format(where, cfg.seq, context), 2) end
  local log_every = whole(opts.log_every, 'log_every', where, math.max(1, math.floor(cfg.steps / 10)))
  if corpus.vocab_size and model.config and model.config.vocab and corpus.vocab_size > model.config.vocab then
    error(('%s: the corpus has %d tokens, the model reads %d'):format(where, corpus.vocab_size, model.config.vocab), 2)
  end
  local self = new(model, layers, 'tuned')
  local params = {}
  -- the translators' width: the residual stream's, from one window
  torch.manual_seed(cfg.seed)
  local x = corpus:batch(1, math.min(cfg.seq, 8), {split = cfg.split, device = model:device()})
  local h0 = states(self, x, nil, where)
  local dim, device, dtype = h0[0]:size(-1), h0[0].device, h0[0].dtype
  for i = 0, #layers - 1 do
    local t = {weight = torch.zeros(dim, dim, {dtype = dtype, device = device}):requires_grad_(true),
      bias = torch.zeros(dim, {dtype = dtype, device = device}):requires_grad_(true)}
    self.translators[i] = t
    params[#params + 1], params[#params + 2] = t.weight, t.bias
  end
  -- the model frozen (no gradient into its weights) and in eval mode; both
  -- as they were after, an error included (probe.scope)
  local opt = optim.AdamW(params, {lr = cfg.lr, weight_decay = cfg.weight_decay})
  local history = {}
  scope.run(model, function()
    torch.manual_seed(cfg.seed)
    for step = 1, cfg.steps do
      local xb = corpus:batch(cfg.batch, cfg.seq, {split = cfg.split, device = device})
      local h, logits = states(self, xb, nil, where)
      local final_logp = logits:log_softmax(-1)
      local total
      for i = 0, #layers - 1 do
        local loss = kl(final_logp, self:readout(i, h[i])):mean()
        total = total and total + loss or loss
      end
      opt:zero_grad()
      total:backward()
      opt:step()
      local v = total:item() / #layers
      if v ~= v then error(('%s: the KL became NaN at step %d (lr %g too large?)'):format(where, step, cfg.lr), 0) end
      history[step] = v
      if not opts.quiet and (step % log_every == 0 or step == cfg.steps) then
        print(('lens.tuned step %d/%d | mean KL over %d layers %.4f'):format(step, cfg.steps, #layers, v))
      end
    end
  end, {mode = 'eval', frozen = true})
  for i = 0, #layers - 1 do
    local t = self.translators[i]
    t.weight, t.bias = t.weight:detach(), t.bias:detach()
  end
  cfg.data = corpus.file_info and corpus:file_info().sha256 or nil
  self.config, self.history = cfg, history
  self.model_name, self.weights_sha256 = model_name(model), lens.weights_sha256(model)
  return self
end

-- lens.from_translators(model, translators) -> a tuned lens with given
-- translators: translators[i] = {weight = (C, C), bias = (C)} for each row
-- i = 0 (embed) .. N - 1 (the last layer's readout is the model's output,
-- untranslated); row i reads h + h W^T + b. lens.load builds its lens here.
function lens.from_translators(model, translators)
  local where = 'lens.from_translators'
  local layers = layers_of(model, where)
  argument(translators, 'translators', 'table', where)
  local self = new(model, layers, 'tuned')
  local C
  for i = 0, #layers - 1 do
    local t = translators[i]
    local name = self.names[i + 1]
    if type(t) ~= 'table' or not torch.is_tensor(t.weight) or not torch.is_tensor(t.bias) then
      error(('%s: translators[%d] (%s) must be {weight = Tensor, bias = Tensor}, got %s'):format(where, i, name, type(t)), 2)
    end
    C = C or t.weight:size(1)
    if t.weight:dim() ~= 2 or t.weight:size(1) ~= C or t.weight:size(2) ~= C or t.bias:dim() ~= 1 or t.bias:size(1) ~= C then
      error(('%s: translators[%d] (%s) must be a (%d, %d) weight and a (%d) bias, got %s and %s'):format(where, i, name, C, C, C,
        format.shape(t.weight), format.shape(t.bias)), 2)
    end
    if not t.weight:isfinite():all():item() or not t.bias:isfinite():all():item() then
      error(('%s: translators[%d] (%s) holds NaN or infinite values'):format(where, i, name), 2)
    end
    self.translators[i] = {weight = t.weight:detach(), bias = t.bias:detach()}
  end
  if translators[#layers] ~= nil then
    error(('%s: translators[%d] is the last layer (%s), whose readout is the model\'s output: it has no translator'):format(where,
      #layers, self.names[#layers + 1]), 2)
  end
  self.model_name, self.weights_sha256, self.config = model_name(model), lens.weights_sha256(model), {}
  return self
end

-- l:save(path) -> path: a tuned lens's translators as safetensors
-- ('<row>.weight', '<row>.bias'), with the model's name, the hash of its
-- weights and the rows in the metadata (written atomically).
function Lens:save(path)
  argument(path, 'path', 'string', 'lens:save')
  if self.kind ~= 'tuned' then error('lens:save: a logit lens has nothing to save (no translators)', 2) end
  local tensors = {}
  for i = 0, #self.names - 2 do
    tensors[self.names[i + 1] .. '.weight'] = self.translators[i].weight
    tensors[self.names[i + 1] .. '.bias'] = self.translators[i].bias
  end
  local meta = {format = 'anatomy.lens', kind = 'tuned', model = self.model_name or model_name(self.model),
    weights_sha256 = self.weights_sha256 or lens.weights_sha256(self.model), rows = table.concat(self.names, ',')}
  for k, v in pairs(self.config or {}) do meta['config.' .. k] = tostring(v) end
  torch.save_safetensors(path, tensors, meta)
  return path
end

-- lens.load(model, path) -> the tuned lens l:save wrote for this model: an
-- error names what differs when the file is not a lens, its rows are not
-- the model's, or its weights hash is not the model's.
function lens.load(model, path)
  local where = 'lens.load'
  local layers = layers_of(model, where)
  argument(path, 'path', 'string', where)
  local ok, tensors, meta = pcall(torch.load_safetensors, path)
  if not ok then error(('%s: %s'):format(where, tostring(tensors):gsub('^torch%.load_safetensors: ', '')), 2) end
  meta = meta or {}
  if meta.format ~= 'anatomy.lens' then
    error(("%s: '%s' is not a lens saved by lens:save (its metadata format is %s)"):format(where, path, tostring(meta.format)), 2)
  end
  local self = new(model, layers, 'tuned')
  local rows = table.concat(self.names, ',')
  if meta.rows ~= rows then
    error(("%s: '%s' was trained on rows %s; this model's are %s"):format(where, path, tostring(meta.rows), rows), 2)
  end
  local hash = lens.weights_sha256(model)
  if meta.weights_sha256 ~= hash then
    error(("%s: '%s' was trained on %s with weights sha256 %s; this model's weights are %s"):format(where, path,
      tostring(meta.model), tostring(meta.weights_sha256):sub(1, 16), hash:sub(1, 16)), 2)
  end
  local p
  for _, q in model:named_parameters() do p = q break end
  local translators = {}
  for i = 0, #layers - 1 do
    local w, b = tensors[self.names[i + 1] .. '.weight'], tensors[self.names[i + 1] .. '.bias']
    if not (w and b) then error(("%s: '%s' has no translator for %s"):format(where, path, self.names[i + 1]), 2) end
    translators[i] = {weight = w:to({device = p.device}), bias = b:to({device = p.device})}
  end
  local built_ok, built = pcall(lens.from_translators, model, translators)
  if not built_ok then error(("%s: '%s': %s"):format(where, path, tostring(built):gsub('^lens%.from_translators: ', '')), 2) end
  self = built
  self.config = {}
  for k, v in pairs(meta) do
    local key = k:match('^config%.(.*)$')
    if key then self.config[key] = tonumber(v) or v end
  end
  self.model_name, self.weights_sha256 = meta.model, hash
  return self
end

-- The per-token views (probe/lens_views.lua).
Lens.trajectory, Lens.table = views.trajectory, views.table

function Lens:__tostring()
  local n = #self.names - 1
  if self.kind == 'logit' then
    return ('lens.Lens(logit lens of %s: embed and %d layers through its readout)'):format(nn.typename(self.model), n)
  end
  local c = self.config or {}
  return ('lens.Lens(tuned lens of %s: %d translators%s; weights sha256 %s)'):format(self.model_name or nn.typename(self.model), n,
    c.steps and (', trained %d steps of %d x %d tokens at lr %g, seed %s'):format(c.steps, c.batch, c.seq, c.lr, tostring(c.seed)) or '',
    tostring(self.weights_sha256):sub(1, 16))
end

hooks.analysis(Lens.evaluate)
hooks.analysis(lens.tuned)

return lens
