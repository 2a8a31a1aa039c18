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

local architectures = {standard = 'relu', relu = 'relu', topk = 'topk', jumprelu = 'jumprelu', transcoder = 'relu',
  skip_transcoder = 'relu', jumprelu_transcoder = 'jumprelu', jumprelu_skip_transcoder = 'jumprelu'}

-- saelens.transcoder_point(hook_name, hook_name_out) -> the point a
-- transcoder from an MLP's input to its output goes in (TransformerLens's
-- name of the MLP module's output, which sae.attach translates), or nil
function saelens.transcoder_point(hook_in, hook_out)
  local layer = type(hook_out) == 'string' and hook_out:match('^blocks%.(%d+)%.hook_mlp_out$')
  if not layer or type(hook_in) ~= 'string' then return nil end
  for _, site in ipairs{'hook_mlp_in', 'ln2.hook_normalized', 'mlp.hook_in', 'mlp.hook_pre'} do
    if hook_in == ('blocks.%s.%s'):format(layer, site) then return ('blocks.%s.mlp.hook_out'):format(layer) end
  end
end

-- saelens.read_config(folder, where, {overrides, norm_scaling_factor}) ->
-- anatomy's cfg for sae.new, and the folder's own config. overrides: keys
-- that replace cfg.json's (a registry's config_overrides); with a
-- norm_scaling_factor, an SAE trained on activations scaled to an expected
-- norm ('expected_average_only_in') is read, cfg.norm_scaling_factor set
-- for the caller to fold into the weights as SAELens's from_pretrained does.
function saelens.read_config(folder, where, extra)
  extra = extra or {}
  local path = folder .. '/cfg.json'
  if not fs.exists(path) then
    error(("%s: '%s' has no cfg.json (an SAELens folder holds cfg.json and sae_weights.safetensors)"):format(where, folder), 3)
  end
  local ok, raw = pcall(json.decode, fs.read(path))
  if not ok or type(raw) ~= 'table' then error(('%s: %s is not JSON: %s'):format(where, path, tostring(raw)), 3) end
  for k, v in pairs(extra.overrides or {}) do
    raw[k] = v
    if type(raw.metadata) == 'table' and (k == 'hook_name' or k == 'model_name') then raw.metadata[k] = v end
  end
  local arch = raw.architecture or 'standard'
  local kind = architectures[arch]
  if not kind then
    error(("%s: %s: architecture '%s' is not one anatomy reads (expected standard, topk, jumprelu or a transcoder's: "
      .. "transcoder, skip_transcoder, jumprelu_transcoder, jumprelu_skip_transcoder)"):format(
      where, path, tostring(arch)), 3)
  end
  local norm = raw.normalize_activations or 'none'
  local folded = norm == 'expected_average_only_in' and extra.norm_scaling_factor
  if norm ~= 'none' and norm ~= json.null and not folded then
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
  local transcoder = arch:find('transcoder', 1, true) ~= nil
  for _, key in ipairs{'d_in', 'd_sae', transcoder and 'd_out' or nil} do
    local v = raw[key]
    if type(v) ~= 'number' or v < 1 or v % 1 ~= 0 then
      error(('%s: %s: %s must be a whole number >= 1, got %s'):format(where, path, key, tostring(v)), 3)
    end
  end
  local meta = type(raw.metadata) == 'table' and raw.metadata or raw
  local cfg = {d_in = raw.d_in, d_sae = raw.d_sae, kind = kind, k = raw.k, apply_b_dec_to_input = raw.apply_b_dec_to_input ~= false,
    hook_name = type(meta.hook_name) == 'string' and meta.hook_name or nil,
    model_name = type(meta.model_name) == 'string' and meta.model_name or nil}
  cfg.norm_scaling_factor = folded or nil
  if transcoder then  -- SAELens's transcoders: b_dec in the output's space, never subtracted from the input
    cfg.transcoder, cfg.apply_b_dec_to_input, cfg.d_out = true, false, raw.d_out
    cfg.skip = arch:find('skip', 1, true) ~= nil or nil
    cfg.hook_name_out = type(meta.hook_name_out) == 'string' and meta.hook_name_out or nil
  end
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
  saelens.check_shapes(tensors, cfg, path, 'cfg.json', where, 4)
  return tensors
end

-- saelens.check_shapes(tensors, cfg, what, config, where, level): each
-- tensor the SAE needs present, in the shape cfg's d_in, d_sae (and d_out)
-- give it; an error names what holds the tensors and the config that disagrees
function saelens.check_shapes(tensors, cfg, what, config, where, level)
  local D, F, D_out = cfg.d_in, cfg.d_sae, cfg.d_out or cfg.d_in
  local want = {W_enc = {D, F}, b_enc = {F}, W_dec = {F, D_out}, b_dec = {D_out},
    threshold = cfg.kind == 'jumprelu' and {F} or nil, W_skip = cfg.skip and {D_out, D} or nil}
  for _, name in ipairs{'W_enc', 'b_enc', 'W_dec', 'b_dec', 'threshold', 'W_skip'} do
    local t, shape = tensors[name], want[name]
    if shape then
      if not t then error(('%s: %s: no tensor %s'):format(where, what, name), level) end
      if not torch.is_tensor(t) or format.shape(t) ~= table.concat(shape, 'x') then
        error(('%s: %s: %s has shape %s, %s (d_in %d, d_sae %d%s) says %s'):format(where, what, name,
          torch.is_tensor(t) and format.shape(t) or type(t), config, D, F, D_out ~= D and (', d_out ' .. D_out) or '',
          table.concat(shape, 'x')), level)
      end
    end
  end
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
  local other_out = c.skip or (c.d_out and c.d_out ~= c.d_in)  -- only SAELens's transcoder classes hold these
  if other_out then
    if arch == 'topk' then error('sae:save: SAELens has no TopK transcoder with an affine skip or another output width', 3) end
    arch = (arch == 'jumprelu' and 'jumprelu_' or '') .. (c.skip and 'skip_' or '') .. 'transcoder'
    if c.skip then tensors.W_skip = s.W_skip:detach():float():contiguous() end
  end
  local cfg = {architecture = arch, d_in = c.d_in, d_sae = c.d_sae, d_out = other_out and (c.d_out or c.d_in) or nil,
    dtype = 'float32', device = 'cpu',
    apply_b_dec_to_input = c.apply_b_dec_to_input, normalize_activations = 'none', reshape_activations = 'none',
    -- sae_lens_version: the layout's version as SAELens dates it (without one it reads the flat pre-6 layout)
    metadata = json.object{sae_lens_version = '6.0.0', model_name = c.model_name, hook_name = c.hook_name or c.point, anatomy_point = c.point,
      transcoder = c.transcoder or nil, hook_name_out = c.hook_name_out}}
  if arch == 'topk' then cfg.k = c.k end
  fs.mkdir(folder)
  torch.save_safetensors(folder .. '/sae_weights.safetensors', tensors, {format = 'saelens'})
  fs.write_atomic(folder .. '/cfg.json', json.encode(cfg) .. '\n')
end

return saelens
