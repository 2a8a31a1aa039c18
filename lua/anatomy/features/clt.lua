-- The sae module's transcoder functions: sae.clt (a new CLT or set of
-- per-layer transcoders) and sae.load_clt (circuit-tracer's folders), and
-- the checks they share. features/init.lua puts them on sae.
local torch = require('anatomy.torch')
local options = require('anatomy.torch.options')
local CLT = require('anatomy.features.CLT')
local files = require('anatomy.features.clt_files')
local splice = require('anatomy.features.clt_splice')
local training = require('anatomy.features.train')
local nn = require('anatomy.nn')
local fs = require('anatomy.io.fs')
local hub = require('anatomy.io.hub')
local M = {}

M.allowed = {'n_layers', 'd_model', 'd_transcoder', 'kind', 'k', 'cross_layer', 'skip', 'input_hook', 'output_hook', 'threshold',
  'model_name', 'bandwidth'}

local function flag(v, name, where, default, level)
  if v == nil then return default end
  if type(v) ~= 'boolean' then error(('%s: %s must be true or false, got %s'):format(where, name, tostring(v)), level + 1) end
  return v
end

-- M.check(cfg, where, level) -> the complete cfg of a sae.CLT
function M.check(cfg, where, level)
  level = level + 1
  cfg = options.check(cfg, M.allowed, where, level)
  local c = {}
  for k, v in pairs(cfg) do c[k] = v end
  for _, key in ipairs{'n_layers', 'd_model', 'd_transcoder'} do
    c[key] = options.whole(cfg[key], key, where, nil, 1, level)
    if not c[key] then error(('%s: %s is needed (n_layers, d_model, d_transcoder: layers, width, features a layer)'):format(where, key), level) end
  end
  c.kind = cfg.kind or 'jumprelu'
  if not CLT.kinds[c.kind] then
    local near = options.closest(tostring(cfg.kind), {'relu', 'jumprelu', 'topk'})
    error(("%s: kind must be 'jumprelu', 'relu' or 'topk', got %s%s"):format(where, tostring(cfg.kind),
      near and (" (did you mean '%s'?)"):format(near) or ''), level)
  end
  if c.kind == 'topk' then
    c.k = options.whole(cfg.k, 'k', where, math.min(32, c.d_transcoder), 1, level)
    if c.k > c.d_transcoder then error(('%s: k must be at most d_transcoder %d, got %d'):format(where, c.d_transcoder, c.k), level) end
  elseif cfg.k ~= nil then
    error(("%s: k is for kind 'topk', not '%s'"):format(where, c.kind), level)
  end
  c.cross_layer = flag(cfg.cross_layer, 'cross_layer', where, true, level)
  c.skip = flag(cfg.skip, 'skip', where, false, level)
  if c.skip and c.cross_layer then
    error(("%s: skip is for per-layer transcoders (cross_layer = false): circuit-tracer's cross-layer files hold no W_skip"):format(where), level)
  end
  c.input_hook = cfg.input_hook or 'ln2.hook_normalized'
  c.output_hook = cfg.output_hook or 'hook_mlp_out'
  splice.check_hooks(c.input_hook, c.output_hook, where, level)
  if cfg.threshold ~= nil and (type(cfg.threshold) ~= 'number' or cfg.threshold ~= cfg.threshold) then
    error(('%s: threshold must be a number, got %s'):format(where, tostring(cfg.threshold)), level)
  end
  return c
end

-- sae.clt{n_layers, d_model, d_transcoder, kind = 'jumprelu'|'relu'|'topk',
-- k, cross_layer = true, skip = false, input_hook = 'ln2.hook_normalized',
-- output_hook = 'hook_mlp_out', threshold = 0} -> an untrained sae.CLT:
-- circuit-tracer's CrossLayerTranscoder (layer l's features decode to the
-- MLP outputs of layers l..L), or with cross_layer = false its
-- TranscoderSet (each layer's to its own; skip adds W_skip). input_hook
-- and output_hook are where the features read and write, as circuit-tracer's
-- config.yaml names them: 'ln2.hook_normalized' or 'mlp.hook_in' (the MLP's
-- input), 'hook_resid_mid'; 'hook_mlp_out' (what the MLP adds to the stream)
-- or 'mlp.hook_out'.
function M.new(cfg)
  return CLT(M.check(cfg, 'sae.clt', 2))
end

-- A Hub reference as circuit-tracer's HfUri reads one: 'org/name',
-- 'org/name/subfolder', either with '@revision', with or without 'hf://'.
local function hub_reference(ref)
  local path, revision = ref:gsub('^hf://', ''):match('^([^@]+)@?(.*)$')
  local repo, sub = (path or ''):match('^([^/]+/[^/]+)/?(.*)$')
  if not repo then return nil end
  return repo, sub ~= '' and (sub:gsub('/+$', '')) or nil, revision ~= '' and revision or nil
end

-- The folder of a Hub reference in the cache, with what sae.load_clt reads
-- fetched: config.yaml and the consecutive W_enc_{i}, W_dec_{i} or layer_{i} files.
local function from_hub(ref, opts, where)
  local repo, sub, revision = hub_reference(ref)
  if not repo or not hub.is_repo_id(repo) then
    error(("%s: '%s' is neither a folder nor a Hub reference ('org/name[/subfolder][@revision]')"):format(where, ref), 0)
  end
  if revision and opts.revision and revision ~= opts.revision then
    error(("%s: '%s' names revision %s and the options %s"):format(where, ref, revision, opts.revision), 0)
  end
  local snap = hub.open(repo, {revision = opts.revision or revision, token = opts.token, cache_dir = opts.cache_dir,
    local_files_only = opts.local_files_only, where = where})
  local prefix = sub and (sub .. '/') or ''
  if snap:has(prefix .. 'config.yaml') then snap:fetch(prefix .. 'config.yaml') end
  for _, stem in ipairs{'W_enc_', 'W_dec_', 'layer_'} do
    local i = 0
    while i < 4096 and snap:has(('%s%s%d.safetensors'):format(prefix, stem, i)) do
      snap:fetch(('%s%s%d.safetensors'):format(prefix, stem, i))
      i = i + 1
    end
  end
  return snap.folder .. (sub and ('/' .. sub) or '')
end

-- sae.load_clt(folder, {input_hook, output_hook, revision, token,
-- cache_dir, local_files_only}) -> a sae.CLT from circuit-tracer's files:
-- W_enc_{i}/W_dec_{i}.safetensors (a CLT) or layer_{i}.safetensors (a set,
-- with or without W_skip), a JumpReLU where they hold thresholds, else a
-- ReLU. folder: a folder, or a Hub reference as circuit-tracer's
-- load_transcoder_from_hub takes one ('org/name[/subfolder][@revision]'),
-- fetched through anatomy's Hub client (its cache, HF_HUB_OFFLINE). The
-- hooks: the call's, else the folder's config.yaml, else what anatomy's
-- c:save noted in the first file, else load_clt's defaults
-- ('hook_resid_mid', 'hook_mlp_out'). Every tensor's shape is checked
-- before any is kept.
function M.load(folder, opts)
  local where = 'sae.load_clt'
  opts = options.check(opts, {'input_hook', 'output_hook', 'revision', 'token', 'cache_dir', 'local_files_only'}, where, 2)
  if type(folder) ~= 'string' or folder == '' then error(('%s: folder must be a string, got %s'):format(where, tostring(folder)), 2) end
  local ok, cfg, tensors = pcall(function()
    local path = fs.is_dir(folder) and folder or from_hub(folder, opts, where)
    return files.read(path, where)
  end)
  if not ok then error(cfg, 2) end
  -- circuit-tracer's load_clt defaults where neither the folder nor the call names them
  cfg.input_hook = opts.input_hook or cfg.input_hook or 'hook_resid_mid'
  cfg.output_hook = opts.output_hook or cfg.output_hook or 'hook_mlp_out'
  splice.check_hooks(cfg.input_hook, cfg.output_hook, where, 2)
  local c = CLT(cfg)
  torch.no_grad(function()
    for name, t in pairs(tensors) do c[name]:copy_(t) end
  end)
  return c
end

-- sae.train_clt(model, corpus, {kind = 'jumprelu'|'relu'|'topk', width =
-- 8·D features a layer, cross_layer = true, skip = false, input_hook,
-- output_hook, l0, l1, tanh_c = 1, and sae.train's other options but point
-- and transcoder}) -> c, history: a sae.CLT (or, with cross_layer = false, a
-- set of per-layer transcoders) trained by sae.train's loop on every
-- layer's MLP input and output at once (dead features, the auxiliary-k
-- loss for topk, checkpoint and exact resume, the activation cache). The
-- loss is Σ_l ‖ŷ_l − y_l‖² / σ_l² plus, for jumprelu, l0 · Σ tanh(tanh_c ·
-- ‖W_dec‖ · f / σ) (the CLT paper's), for relu l1 · Σ ‖W_dec‖ · f / σ, with
-- ‖W_dec‖ the norm of all a feature writes (features/clt_train.lua).
function M.train(model, corpus, opts)
  local where = 'sae.train_clt'
  if not nn.is_module(model) then error(('%s: model must be a model, got %s'):format(where, nn.typename(model)), 2) end
  if corpus == nil or (type(corpus) ~= 'table' and type(corpus) ~= 'userdata') or not corpus.batch then
    error(('%s: corpus must be a data.Corpus, got %s'):format(where, type(corpus)), 2)
  end
  options.check(opts, training.allowed_clt, where, 2)
  local o = {}
  for k, v in pairs(opts or {}) do o[k] = v end
  local shape = {cross_layer = flag(o.cross_layer, 'cross_layer', where, true, 2), skip = flag(o.skip, 'skip', where, false, 2),
    input_hook = o.input_hook or 'ln2.hook_normalized', output_hook = o.output_hook or 'hook_mlp_out'}
  if shape.skip and shape.cross_layer then
    error(("%s: skip is for per-layer transcoders (cross_layer = false): circuit-tracer's cross-layer files hold no W_skip"):format(where), 2)
  end
  splice.check_hooks(shape.input_hook, shape.output_hook, where, 2)
  local layers, why = model:layers()
  if not layers then error(('%s: %s'):format(where, why), 2) end
  shape.n_layers = #layers
  shape.locations = splice.locations(model, {cfg = shape}, where, 2)
  -- the activation cache's and the checkpoint's name of what is read
  o.point = ('transcoders: %s -> %s'):format(shape.input_hook, shape.output_hook)
  o.cross_layer, o.skip, o.input_hook, o.output_hook = nil, nil, nil, nil
  return training.train(model, corpus, o, where, shape)
end

return M
