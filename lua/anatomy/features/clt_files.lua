-- circuit-tracer's transcoder folders, read and written (its 0.5.0 layout):
--   a cross-layer transcoder   W_enc_{i}.safetensors: W_enc_{i} (F, D), b_enc_{i} (F), b_dec_{i} (D)[, threshold_{i} (F)]
--                              W_dec_{i}.safetensors: W_dec_{i} (F, L − i, D)
--   a per-layer set            layer_{i}.safetensors: W_enc (F, D), W_dec (F, D), b_enc (F), b_dec (D)
--                              [, activation_function.threshold (F)][, W_skip (D, D)]
-- i = 0 .. L − 1, beside a config.yaml (model_kind, feature_input_hook,
-- feature_output_hook) that circuit-tracer's Hub loader reads. A threshold
-- makes a JumpReLU, none a ReLU: what circuit-tracer infers from the same files.
local torch = require('anatomy.torch')
local json = require('anatomy.io.json')
local yaml = require('anatomy.io.yaml')
local fs = require('anatomy.io.fs')
local format = require('anatomy.render.format')
local files = {}

local MAX_LAYERS = 4096  -- more W_enc_{i} files than any model has layers: not a transcoder folder

local function shape_of(dims) return format.shape(torch.empty(dims)) end

local function load(path, where)
  local ok, t, meta = pcall(torch.load_safetensors, path)
  if not ok then error(('%s: %s'):format(where, tostring(t):gsub('^torch%.load_safetensors: ', '')), 0) end
  return t, meta or {}
end

local function want(t, name, dims, path, where)
  local v = t[name]
  if v == nil then error(('%s: %s has no tensor %s'):format(where, path, name), 0) end
  if format.shape(v) ~= shape_of(dims) then
    error(('%s: %s: %s has shape %s, expected %s'):format(where, path, name, format.shape(v), shape_of(dims)), 0)
  end
  if not v:is_floating_point() then error(('%s: %s: %s is %s, not floating point'):format(where, path, name, v.dtype), 0) end
  return v:float()
end

-- The number of consecutive files folder/<stem>{0,1,...}.safetensors.
local function count(folder, stem)
  local n = 0
  while n < MAX_LAYERS and fs.exists(('%s/%s%d.safetensors'):format(folder, stem, n)) do n = n + 1 end
  return n
end

-- config.yaml's settings where the folder has one (circuit-tracer's
-- model_kind, feature_input_hook, feature_output_hook, model_name), {}
-- where it has none; a file that is not a YAML mapping is an error.
local function config_yaml(folder, where)
  local path = folder .. '/config.yaml'
  if not fs.exists(path) then return {} end
  local ok, v = pcall(yaml.read, path)
  if not ok then error(('%s: %s'):format(where, (tostring(v):gsub('^.-yaml%.read: ', ''))), 0) end
  if type(v) ~= 'table' then error(('%s: %s is not a YAML mapping'):format(where, path), 0) end
  for _, key in ipairs{'model_kind', 'feature_input_hook', 'feature_output_hook', 'model_name'} do
    if v[key] ~= nil and type(v[key]) ~= 'string' then
      error(('%s: %s: %s must be a string, got %s'):format(where, path, key, tostring(v[key])), 0)
    end
  end
  return v
end

-- files.read(folder, where) -> cfg, tensors: a folder in either layout,
-- its tensors as sae.CLT names them (W_enc (L, F, D), b_enc, b_dec,
-- threshold, W_dec_0 ..., W_skip), float32, every shape checked against
-- the first layer's before anything is kept.
function files.read(folder, where)
  if type(folder) ~= 'string' or not fs.is_dir(folder) then
    error(('%s: %s is not a folder'):format(where, tostring(folder)), 0)
  end
  local n_cross, n_set = count(folder, 'W_enc_'), count(folder, 'layer_')
  if n_cross == 0 and n_set == 0 then
    error(("%s: '%s' holds neither W_enc_0.safetensors (a cross-layer transcoder) nor layer_0.safetensors (per-layer transcoders), circuit-tracer's layouts"):format(where, folder), 0)
  end
  if n_cross > 0 and n_set > 0 then
    error(("%s: '%s' holds both W_enc_0.safetensors and layer_0.safetensors: which transcoders it is is ambiguous"):format(where, folder), 0)
  end
  local cross = n_cross > 0
  local L = cross and n_cross or n_set
  local enc, b_enc, b_dec, thr, skip, dec = {}, {}, {}, {}, {}, {}
  local F, D, has_thr, has_skip, meta0
  for i = 0, L - 1 do
    local path = ('%s/%s%d.safetensors'):format(folder, cross and 'W_enc_' or 'layer_', i)
    local t, meta = load(path, where)
    if i == 0 then meta0 = meta end
    local W = t[cross and ('W_enc_' .. i) or 'W_enc']
    if W == nil then error(('%s: %s has no tensor %s'):format(where, path, cross and ('W_enc_' .. i) or 'W_enc'), 0) end
    if W:dim() ~= 2 then error(('%s: %s: W_enc has shape %s, expected (d_transcoder, d_model)'):format(where, path, format.shape(W)), 0) end
    if i == 0 then
      F, D = W:size(1), W:size(2)
      has_thr = t[cross and 'threshold_0' or 'activation_function.threshold'] ~= nil
      has_skip = not cross and t.W_skip ~= nil
    end
    local suffix = cross and ('_' .. i) or ''
    enc[i + 1] = want(t, cross and ('W_enc_' .. i) or 'W_enc', {F, D}, path, where)
    b_enc[i + 1] = want(t, 'b_enc' .. suffix, {F}, path, where)
    b_dec[i + 1] = want(t, 'b_dec' .. suffix, {D}, path, where)
    local tname = cross and ('threshold_' .. i) or 'activation_function.threshold'
    if (t[tname] ~= nil) ~= has_thr then
      error(('%s: %s %s a threshold and layer 0 %s: a JumpReLU in some layers only is not one transcoder'):format(where, path,
        has_thr and 'has no' or 'has', has_thr and 'has' or 'has none'), 0)
    end
    if has_thr then thr[i + 1] = want(t, tname, {F}, path, where) end
    if not cross then
      if t.log_thresholds ~= nil then error(('%s: %s holds log_thresholds, which circuit-tracer refuses too'):format(where, path), 0) end
      if (t.W_skip ~= nil) ~= has_skip then
        error(('%s: %s and layer 0 differ in having a skip (W_skip)'):format(where, path), 0)
      end
      if has_skip then skip[i + 1] = want(t, 'W_skip', {D, D}, path, where) end
      dec[i + 1] = want(t, 'W_dec', {F, D}, path, where):unsqueeze(2)  -- (F, 1, D)
    else
      local dpath = ('%s/W_dec_%d.safetensors'):format(folder, i)
      if not fs.exists(dpath) then error(('%s: %s has W_enc_%d.safetensors but no W_dec_%d.safetensors'):format(where, folder, i, i), 0) end
      local d = load(dpath, where)
      dec[i + 1] = want(d, 'W_dec_' .. i, {F, L - i, D}, dpath, where)
    end
  end
  local tensors = {W_enc = torch.stack(enc, 1), b_enc = torch.stack(b_enc, 1), b_dec = torch.stack(b_dec, 1),
    threshold = has_thr and torch.stack(thr, 1) or nil, W_skip = has_skip and torch.stack(skip, 1) or nil}
  for i = 1, L do tensors['W_dec_' .. (i - 1)] = dec[i] end
  local ok, own = pcall(json.decode, meta0.anatomy or '{}')
  if not ok or type(own) ~= 'table' then own = {} end
  local config = config_yaml(folder, where)
  local kind = cross and 'cross_layer_transcoder' or 'transcoder_set'
  if config.model_kind ~= nil and config.model_kind ~= kind then
    error(('%s: %s/config.yaml says model_kind %s; its files are a %s'):format(where, folder, config.model_kind, kind), 0)
  end
  local cfg = {n_layers = L, d_model = D, d_transcoder = F, kind = has_thr and 'jumprelu' or 'relu', cross_layer = cross,
    skip = has_skip, input_hook = config.feature_input_hook or own.input_hook,
    output_hook = config.feature_output_hook or own.output_hook, model_name = config.model_name or own.model_name}
  return cfg, tensors
end

local function yaml_line(key, value) return ('%s: "%s"\n'):format(key, (tostring(value):gsub('["\\]', '\\%0'))) end

-- files.write(c, folder): c in circuit-tracer's layout (float32, each file
-- written atomically), config.yaml beside; anatomy's own settings in the
-- first file's metadata. A TopK has no form there (circuit-tracer's
-- transcoders are ReLU or JumpReLU): an error, never a file it misreads.
function files.write(c, folder, where)
  local cfg = c.cfg
  if cfg.kind == 'topk' then
    error(("%s: circuit-tracer's transcoders are ReLU or JumpReLU; a TopK one has no form in its files (train kind = 'jumprelu' or 'relu')"):format(where), 0)
  end
  fs.mkdir(folder)
  local L = cfg.n_layers
  local own = json.encode(json.object{input_hook = cfg.input_hook, output_hook = cfg.output_hook, model_name = cfg.model_name})
  local function f32(t) return t:detach():float():contiguous() end
  for i = 0, L - 1 do
    local l = i + 1
    local meta = i == 0 and {format = 'pt', anatomy = own} or {format = 'pt'}
    if cfg.cross_layer then
      local enc = {['W_enc_' .. i] = f32(c.W_enc:select(1, l)), ['b_enc_' .. i] = f32(c.b_enc:select(1, l)), ['b_dec_' .. i] = f32(c.b_dec:select(1, l))}
      if c.threshold then enc['threshold_' .. i] = f32(c.threshold:select(1, l)) end
      torch.save_safetensors(('%s/W_enc_%d.safetensors'):format(folder, i), enc, meta)
      torch.save_safetensors(('%s/W_dec_%d.safetensors'):format(folder, i), {['W_dec_' .. i] = f32(c:decoder(l))}, {format = 'pt'})
    else
      local t = {W_enc = f32(c.W_enc:select(1, l)), W_dec = f32(c:decoder(l):select(2, 1)), b_enc = f32(c.b_enc:select(1, l)), b_dec = f32(c.b_dec:select(1, l))}
      if c.threshold then t['activation_function.threshold'] = f32(c.threshold:select(1, l)) end
      if c.W_skip then t.W_skip = f32(c.W_skip:select(1, l)) end
      torch.save_safetensors(('%s/layer_%d.safetensors'):format(folder, i), t, meta)
    end
  end
  local lines = {('# written by anatomy: circuit-tracer reads this folder (load_clt, load_transcoder_set)\n'),
    yaml_line('model_kind', cfg.cross_layer and 'cross_layer_transcoder' or 'transcoder_set'),
    yaml_line('feature_input_hook', cfg.input_hook), yaml_line('feature_output_hook', cfg.output_hook)}
  if cfg.model_name then lines[#lines + 1] = yaml_line('model_name', cfg.model_name) end
  fs.write_atomic(folder .. '/config.yaml', table.concat(lines))
end

return files
