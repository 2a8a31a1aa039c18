-- sae.from_pretrained: a pretrained SAE or transcoder by release and id, as
-- SAELens's SAE.from_pretrained(release, sae_id) names them. The registry
-- (features/releases.lua) gives the Hub repository, the SAE's path in it and
-- its format (features/formats.lua); the files come through anatomy's Hub
-- client (io/hub.lua: huggingface_hub's cache, revisions, offline mode).
local torch = require('anatomy.torch')
local options = require('anatomy.torch.options')
local hub = require('anatomy.io.hub')
local SAE = require('anatomy.features.SAE')
local saelens = require('anatomy.features.saelens')
local releases = require('anatomy.features.releases')
local formats = require('anatomy.features.formats')
local by_release = {}

local readers = {'sae_lens', 'gemma_2', 'gemma_2_transcoder', 'gemma_3', 'llama_scope', 'sparsify', 'mwhanna_transcoder'}
-- SAELens's formats whose weights are Python pickles (its loaders torch.load them)
local pickled = {qwen_scope = true, goodfire = true, deepseek_r1 = true, connor_rob_hook_z = true, dictionary_learning_1 = true}
local dtypes = {float32 = 'float32', bfloat16 = 'bfloat16', float16 = 'float16'}
-- the overrides a registry may give that change what anatomy computes or names
local kept_overrides = {hook_name = true, model_name = true, normalize_activations = true}

local function check_opts(opts, where)
  opts = options.check(opts, {'revision', 'registry', 'device', 'dtype', 'token', 'cache_dir', 'local_files_only'}, where, 3)
  for _, k in ipairs{'revision', 'registry', 'cache_dir', 'device'} do
    if opts[k] ~= nil and (type(opts[k]) ~= 'string' or opts[k] == '') then
      error(('%s: %s must be a non-empty string, got %s'):format(where, k, tostring(opts[k])), 3)
    end
  end
  if opts.dtype ~= nil and not dtypes[opts.dtype] then
    error(("%s: dtype must be 'float32', 'bfloat16' or 'float16', got %s"):format(where, tostring(opts.dtype)), 3)
  end
  if opts.local_files_only ~= nil and type(opts.local_files_only) ~= 'boolean' then
    error(('%s: local_files_only must be true or false, got %s'):format(where, tostring(opts.local_files_only)), 3)
  end
  return opts
end

-- The SAE's own cfg (what sae.new takes), from a format's
local function sae_cfg(c)
  return {d_in = c.d_in, d_sae = c.d_sae, d_out = c.d_out ~= c.d_in and c.d_out or nil, kind = c.kind, k = c.k,
    apply_b_dec_to_input = c.apply_b_dec_to_input ~= false, skip = c.skip or nil, transcoder = c.transcoder or nil,
    point = c.point, hook_name = c.hook_name, hook_name_out = c.hook_name_out, model_name = c.model_name}
end

-- The SAE of one release's row: its files fetched, read by its format,
-- checked, folded, made (a pcall'd helper of from_pretrained)
local function load(release, sae_id, entry, row, conv, source, opts, where)
  local snap  -- opened at the first file, so that what a format refuses by its names is said first
  local overrides = {}
  for k, v in pairs(type(entry.config_overrides) == 'table' and entry.config_overrides or {}) do
    if kept_overrides[k] then overrides[k] = v end
  end
  local nsf = row.norm_scaling_factor
  if nsf ~= nil and (type(nsf) ~= 'number' or not (nsf > 0) or nsf == math.huge) then
    error(("%s: %s: release '%s', id '%s' has a norm_scaling_factor that is not a positive number: %s"):format(
      where, source, release, tostring(sae_id), tostring(nsf)), 0)
  end
  local ctx = {entry = entry, sae = {id = row.id, path = tostring(row.path), norm_scaling_factor = nsf},
    overrides = overrides, where = where}
  local function open()
    snap = snap or hub.open(entry.repo_id, {revision = opts.revision, token = opts.token, cache_dir = opts.cache_dir,
      local_files_only = opts.local_files_only, where = where})
  end
  function ctx.has(file) open(); return snap:has(file) end
  function ctx.fetch(file)
    open()
    local why = hub.bad_name(file)
    if why then error(("%s: release '%s' names a file '%s' that %s: refused"):format(where, release, file, why), 0) end
    if not snap:has(file) then
      error(("%s: release '%s', id '%s': '%s' at revision '%s' has no file %s%s"):format(where, release, tostring(sae_id),
        entry.repo_id, snap.revision, file, snap.session.offline and ' in the cache (HF_HUB_OFFLINE=1 or local_files_only)' or ''), 0)
    end
    return snap:fetch(file)
  end
  local c, t = formats[conv](ctx)
  saelens.check_shapes(t, {d_in = c.d_in, d_sae = c.d_sae, d_out = c.d_out, kind = c.kind, skip = c.skip},
    ("release '%s', id '%s'"):format(release, tostring(sae_id)), ('its %s config'):format(conv), where, 0)
  local scale = c.norm_scaling_factor
  if c.normalize == 'expected_average_only_in' then
    scale = row.norm_scaling_factor
    if type(scale) ~= 'number' or not (scale > 0) then
      error(("%s: release '%s', id '%s' was trained on activations scaled to an expected norm, and the registry gives it "
        .. "no norm_scaling_factor to fold in: not read (SAELens warns and runs it unscaled)"):format(where, release, tostring(sae_id)), 0)
    end
  end
  -- made on 'meta' (no memory), its parameters then the file's tensors themselves, in float32 for the fold and
  -- then in the dtype and on the device asked: a 1M-feature dictionary is never held twice over
  local s = SAE(sae_cfg(c), 'meta')
  local device, dtype = opts.device or torch.device(), dtypes[opts.dtype or 'float32']
  local fold = scale and {W_enc = scale, W_dec = 1 / scale, b_dec = 1 / scale}  -- SAELens's fold_activation_norm_scaling_factor
  torch.no_grad(function()
    for _, name in ipairs{'W_enc', 'b_enc', 'W_dec', 'b_dec', 'threshold', 'W_skip'} do
      if s[name] then
        local v = t[name]:float()
        if fold and fold[name] then v = v * fold[name] end
        t[name] = nil
        s:register_parameter(name, v:to(dtype):to(device):contiguous():requires_grad_(true))
      end
    end
  end)
  rawset(s, 'hf_source', {release = release, sae_id = sae_id, repo_id = entry.repo_id, path = tostring(row.path),
    format = conv, revision = snap.revision, commit = snap.commit, registry = source})
  return s
end

-- sae.from_pretrained(release, sae_id, {revision = 'main', registry, device,
-- dtype = 'float32', token, cache_dir, local_files_only}) -> an SAE (a
-- transcoder for a transcoder's release). release and sae_id as SAELens's
-- pretrained_saes.yaml names them ('gemma-scope-2b-pt-res-canonical',
-- 'layer_12/width_16k/canonical'); registry: that file's path (default: an
-- installed sae-lens's, found without Python: $ANATOMY_SAE_REGISTRY, else
-- the sae_lens package of $VIRTUAL_ENV, $CONDA_PREFIX, ~/.local or the
-- system), to which anatomy's own entries add the releases SAELens lacks
-- (EleutherAI's sparsify SAEs). Formats: SAELens's folders (SAEs and
-- transcoders, with or without an affine skip), Gemma Scope's params.npz,
-- Gemma Scope 2's params.safetensors, Llama Scope, EleutherAI's sparsify, circuit-tracer's per-layer transcoder
-- files (SAELens's mwhanna_transcoder). The files come into huggingface_hub's
-- cache (HF_ENDPOINT, HF_HUB_CACHE, HF_HUB_OFFLINE, HF_TOKEN as Python reads
-- them); s.hf_source says the release, id, repository, revision and commit.
function by_release.from_pretrained(release, sae_id, opts)
  local where = 'sae.from_pretrained'
  if type(release) ~= 'string' or release == '' then
    error(('%s: release must be a string (a release of the registry), got %s'):format(where, type(release)), 2)
  end
  if type(sae_id) ~= 'string' and type(sae_id) ~= 'number' then
    error(('%s: sae_id must be a string (an id of the release), got %s'):format(where, type(sae_id)), 2)
  end
  opts = check_opts(opts, where)
  local ok, entry, row, source = pcall(releases.resolve, release, sae_id, opts.registry, where)
  if not ok then error(entry, 2) end
  local conv = entry.conversion_func or 'sae_lens'
  if not formats[conv] then
    error(("%s: release '%s' (%s) is in the format '%s', which anatomy does not read%s (it reads %s)"):format(
      where, release, source, tostring(conv), pickled[conv] and ': its weights are Python pickles (.pt), which run code '
        .. 'when read; anatomy loads no pickle' or '', table.concat(readers, ', ')), 2)
  end
  local s
  ok, s = pcall(load, release, sae_id, entry, row, conv, source, opts, where)
  if not ok then error(s, 2) end
  return s
end

return by_release
