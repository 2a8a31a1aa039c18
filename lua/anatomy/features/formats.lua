-- The formats sae.from_pretrained reads, by SAELens's conversion_func
-- names: each turns a release's files into anatomy's SAE cfg and tensors
-- named as sae.SAE has them (W_enc (D, F), b_enc (F), W_dec (F, D_out),
-- b_dec (D_out), threshold (F), W_skip (D_out, D)). Written from SAELens
-- 6.54's loaders (sae_lens/loading/pretrained_sae_loaders.py) and
-- eai-sparsify 1.3.3's SparseCoder:
--   sae_lens     <path>/cfg.json + sae_weights.safetensors (SAEs and transcoders)
--   gemma_2      Gemma Scope: <path>/params.npz, a JumpReLU (W_enc, W_dec, b_enc, b_dec, threshold)
--   gemma_2_transcoder  the same file, a JumpReLU transcoder from ln2 to the MLP's output
--   llama_scope  Llama Scope: <path>/hyperparams.json + checkpoints/final.safetensors, a JumpReLU with one threshold
--   sparsify     EleutherAI: <hookpoint>/cfg.json + sae.safetensors, TopK (a transcoder with transcode)
--   gemma_3      Gemma Scope 2: <path>/params.safetensors (+ config.json), JumpReLU SAEs and transcoders (affine skip)
--   mwhanna_transcoder  circuit-tracer's per-layer transcoder file layer_N.safetensors (ReLU or JumpReLU, W_skip)
local torch = require('anatomy.torch')
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')
local saelens = require('anatomy.features.saelens')
local formats = {}

local function read_json(path, where)
  local ok, raw = pcall(json.decode, fs.read(path))
  if not ok or type(raw) ~= 'table' then error(('%s: %s is not a JSON object: %s'):format(where, path, tostring(raw)), 0) end
  return raw
end

local function whole(v, name, path, where)
  if type(v) ~= 'number' or v ~= v or v < 1 or v % 1 ~= 0 then
    error(('%s: %s: %s must be a whole number >= 1, got %s'):format(where, path, name, tostring(v)), 0)
  end
  return v
end

local function safetensors(path, where)
  local ok, t = pcall(torch.load_safetensors, path)
  if not ok then error(('%s: %s'):format(where, tostring(t):gsub('^torch%.load_safetensors: ', '')), 0) end
  return t
end

-- numpy's .npz, read in C++ (plain numeric arrays only): name -> tensor
local function npz(path, where)
  local ok, t = pcall(torch.load_npz, path)
  if not ok then error(('%s: %s'):format(where, tostring(t)), 0) end
  return t
end

local function names_of(t)
  local out = {}
  for k in pairs(t) do out[#out + 1] = tostring(k) end
  table.sort(out)
  return out
end

local function layer_of(path, what, where)
  local layer = path:match('layer_(%d+)')
  if not layer then error(("%s: cannot tell the layer of '%s' (no layer_N in its path), as %s needs"):format(where, path, what), 0) end
  return tonumber(layer)
end

-- SAELens's own folder format (the registry's entries with no conversion_func)
function formats.sae_lens(ctx)
  local path = ctx.sae.path
  ctx.fetch(path .. '/sae_weights.safetensors')
  local folder = fs.dirname(ctx.fetch(path .. '/cfg.json'))
  local cfg, raw = saelens.read_config(folder, ctx.where, {overrides = ctx.overrides, norm_scaling_factor = ctx.sae.norm_scaling_factor})
  local tensors = saelens.read_weights(folder, cfg, ctx.where)
  local meta = type(raw.metadata) == 'table' and raw.metadata or {}
  cfg.point = type(meta.anatomy_point) == 'string' and meta.anatomy_point
    or saelens.transcoder_point(cfg.hook_name, cfg.hook_name_out) or cfg.hook_name
  if meta.transcoder == true then cfg.transcoder, cfg.apply_b_dec_to_input = true, false end
  return cfg, tensors
end

-- Gemma Scope's params.npz (lower-case w_ names read as W_), its point
-- from the repository and path as SAELens's get_gemma_2_config_from_hf
-- reads them; D and F from W_enc, checked against the path's width_N.
local function gemma_npz(ctx)
  local file = ctx.fetch(ctx.sae.path .. '/params.npz')
  local t = {}
  for name, v in pairs(npz(file, ctx.where)) do t[name:match('^w_') and ('W_' .. name:sub(3)) or name] = v end
  if not torch.is_tensor(t.W_enc) or t.W_enc:dim() ~= 2 then
    error(('%s: %s has no 2-D W_enc (it holds %s)'):format(ctx.where, file, table.concat(names_of(t), ', ')), 0)
  end
  local widths = {['4k'] = 4096, ['16k'] = 16384, ['32k'] = 32768, ['65k'] = 65536, ['131k'] = 131072, ['262k'] = 262144,
    ['524k'] = 524288, ['1m'] = 1048576}
  local width = widths[ctx.sae.path:match('width_(%w+)') or '']
  if width and width ~= t.W_enc:size(2) then
    error(('%s: %s: W_enc has %d features, its path says width %d'):format(ctx.where, file, t.W_enc:size(2), width), 0)
  end
  if t.scaling_factor and not torch.equal(t.scaling_factor, torch.ones_like(t.scaling_factor)) then
    error(('%s: %s: a scaling_factor other than 1 (a finetuning scale) is not read here'):format(ctx.where, file), 0)
  end
  t.scaling_factor = nil
  return {d_in = t.W_enc:size(1), d_sae = t.W_enc:size(2), kind = 'jumprelu', apply_b_dec_to_input = false}, t, file
end

function formats.gemma_2(ctx)
  local repo, path = ctx.entry.repo_id, ctx.sae.path
  local hook_name
  local embedding = repo:find('res', 1, true) and path:find('embedding', 1, true)
  if embedding then
    hook_name = 'hook_embed'
  elseif repo:find('res', 1, true) then
    hook_name = ('blocks.%d.hook_resid_post'):format(layer_of(path, 'a residual-stream SAE', ctx.where))
  elseif repo:find('mlp', 1, true) then
    hook_name = ('blocks.%d.hook_mlp_out'):format(layer_of(path, "an MLP output's SAE", ctx.where))
  elseif repo:find('att', 1, true) then
    error(("%s: '%s' reads the attention's per-head z (attn.hook_z, heads flattened): not read here; anatomy's SAEs "
      .. "read one point's last dimension"):format(ctx.where, repo), 0)
  else
    error(("%s: cannot tell the point of '%s' (a Gemma Scope repository names res, mlp or att)"):format(ctx.where, repo), 0)
  end
  local cfg, t = gemma_npz(ctx)
  if embedding then
    -- trained on the embeddings scaled by √D (Gemma's embedding scale): SAELens rescales them so
    local s = math.sqrt(cfg.d_in)
    t.W_enc, t.W_dec = t.W_enc / s, t.W_dec * s
  end
  cfg.hook_name, cfg.point = hook_name, hook_name
  return cfg, t
end

function formats.gemma_2_transcoder(ctx)
  local cfg, t = gemma_npz(ctx)
  local layer = ctx.sae.path:match('layer_(%d+)') or ctx.entry.repo_id:match('layer_(%d+)')
  if not layer then error(("%s: cannot tell the layer of '%s'"):format(ctx.where, ctx.sae.path), 0) end
  cfg.transcoder, cfg.d_out = true, t.W_dec and t.W_dec:dim() == 2 and t.W_dec:size(2) or cfg.d_in
  cfg.hook_name, cfg.hook_name_out = ('blocks.%s.ln2.hook_normalized'):format(layer), ('blocks.%s.hook_mlp_out'):format(layer)
  cfg.point = saelens.transcoder_point(cfg.hook_name, cfg.hook_name_out)
  return cfg, t
end

-- Llama Scope: encoder/decoder as nn.Linear weights, one threshold for every
-- feature, trained on activations scaled to norm √D; the registry's
-- norm_scaling_factor folds that scale into the weights (SAELens's
-- get_llama_scope_config_from_hf and from_pretrained).
function formats.llama_scope(ctx)
  local path = ctx.sae.path
  local hp_path = ctx.fetch(path .. '/hyperparams.json')
  local hp = read_json(hp_path, ctx.where)
  local D, F = whole(hp.d_model, 'd_model', hp_path, ctx.where), whole(hp.d_sae, 'd_sae', hp_path, ctx.where)
  local avg = type(hp.dataset_average_activation_norm) == 'table' and hp.dataset_average_activation_norm['in']
  if type(avg) ~= 'number' or not (avg > 0) then
    error(('%s: %s: dataset_average_activation_norm.in must be a positive number, got %s'):format(ctx.where, hp_path, tostring(avg)), 0)
  end
  if type(hp.jump_relu_threshold) ~= 'number' or hp.jump_relu_threshold ~= hp.jump_relu_threshold then
    error(('%s: %s: jump_relu_threshold must be a number, got %s'):format(ctx.where, hp_path, tostring(hp.jump_relu_threshold)), 0)
  end
  if type(hp.hook_point_in) ~= 'string' then error(('%s: %s has no hook_point_in'):format(ctx.where, hp_path), 0) end
  local raw = safetensors(ctx.fetch(path .. '/checkpoints/final.safetensors'), ctx.where)
  local t = {}
  for _, pair in ipairs{{'W_enc', 'encoder.weight'}, {'W_dec', 'decoder.weight'}, {'b_enc', 'encoder.bias'}, {'b_dec', 'decoder.bias'}} do
    local v = raw[pair[2]]
    if not v then error(('%s: %s/checkpoints/final.safetensors has no tensor %s'):format(ctx.where, path, pair[2]), 0) end
    t[pair[1]] = v:dim() == 2 and v:t() or v
  end
  local threshold = hp.jump_relu_threshold * math.sqrt(D) / avg
  t.threshold = torch.full({F}, threshold)
  local cfg = {d_in = D, d_sae = F, kind = 'jumprelu', apply_b_dec_to_input = false, hook_name = hp.hook_point_in,
    point = hp.hook_point_in, model_name = 'meta-llama/Llama-3.1-8B', normalize = 'expected_average_only_in'}
  return cfg, t
end

-- EleutherAI's sparsify: a TopK over ReLU(pre) (activation 'topk'), the
-- encoder as nn.Linear, b_dec subtracted from the input unless it
-- transcodes; a skip connection W_skip (D, D) with skip_connection. Its
-- point from the hook point's folder ('layers.5' the fifth layer's output,
-- 'layers.5.mlp' that MLP, 'embed_tokens' the embeddings).
function formats.sparsify(ctx)
  local path = ctx.sae.path
  local cfg_path = ctx.fetch(path .. '/cfg.json')
  local raw = read_json(cfg_path, ctx.where)
  local D = whole(raw.d_in, 'd_in', cfg_path, ctx.where)
  local F = raw.num_latents and raw.num_latents ~= 0 and raw.num_latents or (type(raw.expansion_factor) == 'number' and D * raw.expansion_factor)
  F = whole(F, 'num_latents (or d_in x expansion_factor)', cfg_path, ctx.where)
  local k = whole(raw.k, 'k', cfg_path, ctx.where)
  if k > F then error(('%s: %s: k %d is more than the %d latents'):format(ctx.where, cfg_path, k, F), 0) end
  if (raw.activation or 'topk') ~= 'topk' then
    error(("%s: %s: activation '%s' is not read here (anatomy reads sparsify's 'topk')"):format(ctx.where, cfg_path, tostring(raw.activation)), 0)
  end
  local transcode, skip = raw.transcode == true, raw.skip_connection == true
  local st = safetensors(ctx.fetch(path .. '/sae.safetensors'), ctx.where)
  local t = {W_enc = st['encoder.weight'] and st['encoder.weight']:dim() == 2 and st['encoder.weight']:t() or st['encoder.weight'],
    b_enc = st['encoder.bias'], W_dec = st.W_dec, b_dec = st.b_dec, W_skip = st.W_skip}
  local hook = path:match('([^/]+)$')
  local layer, rest = hook:match('^[%w_]*layers%.(%d+)(.*)$')
  if not layer then layer, rest = hook:match('^h%.(%d+)(.*)$') end
  local cfg = {d_in = D, d_sae = F, kind = 'topk', k = k, apply_b_dec_to_input = not transcode, skip = skip or nil,
    transcoder = transcode or nil}
  if hook == 'embed_tokens' then cfg.hook_name = 'hook_embed'
  elseif layer and rest == '' then cfg.hook_name = ('blocks.%s.hook_resid_post'):format(layer)
  elseif layer and rest == '.mlp' then
    cfg.hook_name = transcode and ('blocks.%s.hook_mlp_in'):format(layer) or ('blocks.%s.hook_mlp_out'):format(layer)
    cfg.hook_name_out = transcode and ('blocks.%s.hook_mlp_out'):format(layer) or nil
  end
  cfg.point = transcode and layer and rest == '.mlp' and ('blocks.%s.mlp.hook_out'):format(layer) or cfg.hook_name or hook
  if transcode and not cfg.hook_name_out then
    error(("%s: %s transcodes at '%s'; anatomy places a sparsify transcoder on a layer's MLP ('layers.N.mlp')"):format(
      ctx.where, cfg_path, hook), 0)
  end
  return cfg, t
end

-- circuit-tracer's per-layer transcoder files as SAELens's
-- mwhanna_transcoder releases name them ('layer_3.safetensors'): W_enc
-- (F, D), W_dec (F, D), b_enc, b_dec, and where present
-- activation_function.threshold (a JumpReLU) and W_skip (D, D), as
-- circuit-tracer's load_relu_transcoder reads them; from the MLP's input
-- (blocks.L.mlp.hook_in) to its output (blocks.L.hook_mlp_out).
function formats.mwhanna_transcoder(ctx)
  local path = ctx.sae.path
  local layer = path:match('layer_(%d+)%.safetensors$')
  if not layer then error(("%s: cannot tell the layer of '%s' (expected layer_N.safetensors)"):format(ctx.where, path), 0) end
  local file = ctx.fetch(path)
  local st = safetensors(file, ctx.where)
  local known = {W_enc = true, W_dec = true, b_enc = true, b_dec = true, W_skip = true, ['activation_function.threshold'] = true}
  for name in pairs(st) do
    if not known[name] then error(('%s: %s holds %s, which a per-layer transcoder has not (it reads W_enc, W_dec, b_enc, b_dec, '
      .. 'activation_function.threshold, W_skip)'):format(ctx.where, file, name), 0) end
  end
  if not torch.is_tensor(st.W_enc) or st.W_enc:dim() ~= 2 then error(('%s: %s has no 2-D W_enc'):format(ctx.where, file), 0) end
  local F, D = st.W_enc:size(1), st.W_enc:size(2)
  local threshold = st['activation_function.threshold']
  local t = {W_enc = st.W_enc:t(), W_dec = st.W_dec, b_enc = st.b_enc, b_dec = st.b_dec, W_skip = st.W_skip, threshold = threshold}
  local cfg = {d_in = D, d_sae = F, kind = threshold and 'jumprelu' or 'relu', apply_b_dec_to_input = false, transcoder = true,
    skip = st.W_skip ~= nil or nil, hook_name = ('blocks.%s.mlp.hook_in'):format(layer),
    hook_name_out = ('blocks.%s.hook_mlp_out'):format(layer)}
  cfg.point = saelens.transcoder_point(cfg.hook_name, cfg.hook_name_out)
  return cfg, t
end

-- Gemma Scope 2 (SAELens's gemma_3): <path>/params.safetensors (w_enc
-- (D, F), w_dec (F, D_out), b_enc, b_dec, threshold, and a transcoder's
-- affine_skip_connection (D, D_out), stored transposed to W_skip), a
-- JumpReLU not subtracting b_dec; config.json where the path has one (its
-- architecture must be jump_relu, affine_connection says the skip), else
-- what the path says, as SAELens's get_gemma_3_config_from_hf.
function formats.gemma_3(ctx)
  local path = ctx.sae.path
  local layer = path:match('layer_(%d+)')
  if path:find('clt', 1, true) then
    error(("%s: '%s' is a cross-layer transcoder's layer, which sae.from_pretrained does not read (sae.load_clt reads "
      .. "circuit-tracer's cross-layer files)"):format(ctx.where, path), 0)
  end
  if not layer then error(("%s: cannot tell the layer of '%s' (no layer_N in its path)"):format(ctx.where, path), 0) end
  local cfg = {kind = 'jumprelu', apply_b_dec_to_input = false}
  if path:find('resid_post', 1, true) then cfg.hook_name = ('blocks.%s.hook_resid_post'):format(layer)
  elseif path:find('mlp_out', 1, true) then cfg.hook_name = ('blocks.%s.hook_mlp_out'):format(layer)
  elseif path:find('transcoder', 1, true) then
    cfg.transcoder, cfg.hook_name, cfg.hook_name_out = true, ('blocks.%s.hook_mlp_in'):format(layer), ('blocks.%s.hook_mlp_out'):format(layer)
  elseif path:find('attn_out', 1, true) then
    error(("%s: '%s' reads the attention's z (attn.hook_z, heads flattened): not read here; anatomy's SAEs read one "
      .. "point's last dimension"):format(ctx.where, path), 0)
  else
    error(("%s: cannot tell the point of '%s' (resid_post, mlp_out, attn_out or transcoder in its path)"):format(ctx.where, path), 0)
  end
  local affine = path:find('affine', 1, true) ~= nil
  cfg.model_name = ctx.entry.repo_id:gsub('gemma%-scope%-2', 'gemma-3')
  if ctx.has(path .. '/config.json') then
    local cpath = ctx.fetch(path .. '/config.json')
    local raw = read_json(cpath, ctx.where)
    if raw.architecture ~= 'jump_relu' then
      error(("%s: %s: architecture '%s', where Gemma Scope 2's is jump_relu"):format(ctx.where, cpath, tostring(raw.architecture)), 0)
    end
    affine = raw.affine_connection == true
    cfg.model_name = type(raw.model_name) == 'string' and raw.model_name or cfg.model_name
  end
  local file = ctx.fetch(path .. '/params.safetensors')
  local st = safetensors(file, ctx.where)
  if not torch.is_tensor(st.w_enc) or st.w_enc:dim() ~= 2 then error(('%s: %s has no 2-D w_enc'):format(ctx.where, file), 0) end
  local t = {W_enc = st.w_enc, W_dec = st.w_dec, b_enc = st.b_enc, b_dec = st.b_dec, threshold = st.threshold}
  cfg.d_in, cfg.d_sae = st.w_enc:size(1), st.w_enc:size(2)
  if cfg.transcoder then
    cfg.d_out = torch.is_tensor(st.w_dec) and st.w_dec:dim() == 2 and st.w_dec:size(2) or cfg.d_in
    if affine then
      if not st.affine_skip_connection then error(('%s: %s: an affine transcoder without affine_skip_connection'):format(ctx.where, file), 0) end
      cfg.skip, t.W_skip = true, st.affine_skip_connection:dim() == 2 and st.affine_skip_connection:t() or st.affine_skip_connection
    end
  end
  cfg.point = cfg.transcoder and saelens.transcoder_point(cfg.hook_name, cfg.hook_name_out) or cfg.hook_name
  return cfg, t
end

return formats
