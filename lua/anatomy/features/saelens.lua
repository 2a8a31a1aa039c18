-- SAELens's format: a folder with cfg.json and sae_weights.safetensors
-- (W_enc (D, F), b_enc (F), W_dec (F, D), b_dec (D), and threshold (F) for a
-- JumpReLU). Its 'standard' architecture is anatomy's 'relu'; a BatchTopK
-- SAE is written as the JumpReLU it is after training. Reads the flat
-- configs of SAELens 3-5 (hook_name, model_name at the top) and the nested
-- one of 6 (metadata.hook_name).
local torch = require('anatomy.torch')
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')
local format = require('anatomy.render.format')
local saelens = {}

local architectures = {standard = 'relu', relu = 'relu', topk = 'topk', jumprelu = 'jumprelu'}

-- saelens.read_config(folder, where) -> anatomy's cfg for sae.new, and the folder's own config
function saelens.read_config(folder, where)
  local path = folder .. '/cfg.json'
  if not fs.exists(path) then
    error(("%s: '%s' has no cfg.json (an SAELens folder holds cfg.json and sae_weights.safetensors)"):format(where, folder), 3)
  end
  local ok, raw = pcall(json.decode, fs.read(path))
  if not ok or type(raw) ~= 'table' then error(('%s: %s is not JSON: %s'):format(where, path, tostring(raw)), 3) end
  local arch = raw.architecture or 'standard'
  local kind = architectures[arch]
  if not kind then
    error(("%s: %s: architecture '%s' is not one anatomy reads (expected standard, topk or jumprelu)"):format(
      where, path, tostring(arch)), 3)
  end
  local norm = raw.normalize_activations or 'none'
  if norm ~= 'none' and norm ~= json.null then
    error(("%s: %s: normalize_activations '%s' needs the dataset's scaling factor; anatomy reads SAEs with 'none'"):format(
      where, path, tostring(norm)), 3)
  end
  if raw.rescale_acts_by_decoder_norm == true then
    error(('%s: %s: rescale_acts_by_decoder_norm = true (top-k over pre-activations scaled by decoder norms) is not read here'):format(
      where, path), 3)
  end
  if raw.reshape_activations ~= nil and raw.reshape_activations ~= 'none' then
    error(("%s: %s: reshape_activations '%s' (per-head activations) is not read here; anatomy's SAEs read one point's last dimension"):format(
      where, path, tostring(raw.reshape_activations)), 3)
  end
  for _, key in ipairs{'d_in', 'd_sae'} do
    local v = raw[key]
    if type(v) ~= 'number' or v < 1 or v % 1 ~= 0 then
      error(('%s: %s: %s must be a whole number >= 1, got %s'):format(where, path, key, tostring(v)), 3)
    end
  end
  local meta = type(raw.metadata) == 'table' and raw.metadata or raw
  local cfg = {d_in = raw.d_in, d_sae = raw.d_sae, kind = kind, k = raw.k, apply_b_dec_to_input = raw.apply_b_dec_to_input ~= false,
    hook_name = type(meta.hook_name) == 'string' and meta.hook_name or nil,
    model_name = type(meta.model_name) == 'string' and meta.model_name or nil}
  if kind == 'topk' and (type(cfg.k) ~= 'number' or cfg.k < 1 or cfg.k > cfg.d_sae) then
    error(('%s: %s: a topk SAE needs k in 1..%d, got %s'):format(where, path, cfg.d_sae, tostring(cfg.k)), 3)
  end
  return cfg, raw
end

-- saelens.read_weights(folder, cfg, where) -> {W_enc, b_enc, W_dec, b_dec, threshold}, checked against cfg's shapes
function saelens.read_weights(folder, cfg, where)
  local path = folder .. '/sae_weights.safetensors'
  if not fs.exists(path) then error(("%s: '%s' has cfg.json but no sae_weights.safetensors"):format(where, folder), 3) end
  local ok, tensors = pcall(torch.load_safetensors, path)
  if not ok then error(('%s: %s'):format(where, tostring(tensors):gsub('^torch%.load_safetensors: ', '')), 3) end
  local D, F = cfg.d_in, cfg.d_sae
  local want = {W_enc = {D, F}, b_enc = {F}, W_dec = {F, D}, b_dec = {D}}
  if cfg.kind == 'jumprelu' then want.threshold = {F} end
  for _, name in ipairs{'W_enc', 'b_enc', 'W_dec', 'b_dec', 'threshold'} do
    local t, shape = tensors[name], want[name]
    if not shape then break end
    if not t then error(('%s: %s has no tensor %s'):format(where, path, name), 3) end
    if format.shape(t) ~= format.shape(torch.empty(shape)) then
      error(('%s: %s: %s has shape %s, cfg.json (d_in %d, d_sae %d) says %s'):format(where, path, name, format.shape(t), D, F,
        format.shape(torch.empty(shape))), 3)
    end
  end
  return tensors
end

-- saelens.write(s, folder): s's weights and config in SAELens 6's layout
-- (both files written atomically)
function saelens.write(s, folder)
  local c = s.cfg
  local arch = c.kind == 'relu' and 'standard' or c.kind == 'batchtopk' and 'jumprelu' or c.kind
  local tensors = {W_enc = s.W_enc:detach():float():contiguous(), b_enc = s.b_enc:detach():float():contiguous(),
    W_dec = s.W_dec:detach():float():contiguous(), b_dec = s.b_dec:detach():float():contiguous()}
  if arch == 'jumprelu' then
    -- a BatchTopK's one threshold, per feature as a JumpReLU has it
    tensors.threshold = (s.threshold:detach():float() + torch.zeros(c.d_sae)):contiguous()
  end
  local cfg = {architecture = arch, d_in = c.d_in, d_sae = c.d_sae, dtype = 'float32', device = 'cpu',
    apply_b_dec_to_input = c.apply_b_dec_to_input, normalize_activations = 'none', reshape_activations = 'none',
    -- sae_lens_version: the layout's version as SAELens dates it (without one it reads the flat pre-6 layout)
    metadata = json.object{sae_lens_version = '6.0.0', model_name = c.model_name, hook_name = c.hook_name or c.point, anatomy_point = c.point,
      transcoder = c.transcoder or nil}}
  if arch == 'topk' then cfg.k = c.k end
  fs.mkdir(folder)
  torch.save_safetensors(folder .. '/sae_weights.safetensors', tensors, {format = 'saelens'})
  fs.write_atomic(folder .. '/cfg.json', json.encode(cfg) .. '\n')
end

return saelens
