-- models.from_pretrained: a Hugging Face model folder (config.json, the
-- safetensors weights, the tokenizer) read from disk into the library's own
-- blocks, so that probes, the autopsy, the logit lens and layer removal work
-- on a published checkpoint as on a model trained here.
--
-- Layer numbers: Hugging Face counts layers from 0, anatomy from 1. The
-- anatomy model keeps Hugging Face's names otherwise, so `h.0.attn` of a GPT-2
-- checkpoint is `h.1.attn` here (model.h[1]); a Llama's `model.layers.0` is
-- `blocks.1` (every model has a layers() method). models.hf_name and
-- models.anatomy_name translate a dotted name either way.
local torch = require('anatomy.torch')
local native = require('anatomy.torch.native')
local nn = require('anatomy.nn')
local data = require('anatomy.data')
local models = require('anatomy.models')
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')
local hub = require('anatomy.io.hub')
local options = require('anatomy.torch.options')
local format = require('anatomy.render.format')
local process = require('anatomy.models.process')
local sizes = require('anatomy.models.sizes')
local family = require('anatomy.models.family')

local pretrained = {}
pretrained.check_size = sizes.check_size

-- model_type -> the family's module (lua/anatomy/models/<family>.lua): each
-- has check(config, where) -> its settings, build(settings) -> model, and
-- weights(settings, tensors) -> {{anatomy name, hf name, convert}, ...}, where
-- convert is true (stored transposed) or a function of the stored tensor.
pretrained.families = {gpt2 = 'anatomy.models.gpt2', llama = 'anatomy.models.llama', mistral = 'anatomy.models.llama',
  mixtral = 'anatomy.models.llama',
  qwen2 = 'anatomy.models.llama', gpt_neox = 'anatomy.models.gpt_neox', phi = 'anatomy.models.phi',
  qwen3 = 'anatomy.models.qwen3', qwen3_moe = 'anatomy.models.qwen3',
  olmo2 = 'anatomy.models.olmo', olmoe = 'anatomy.models.olmo',
  phi3 = 'anatomy.models.phi3',
  gptj = 'anatomy.models.gptj',
  gemma = 'anatomy.models.gemma', gemma2 = 'anatomy.models.gemma', gemma3_text = 'anatomy.models.gemma',
  gemma3 = 'anatomy.models.gemma'}  -- Gemma3ForConditionalGeneration: its language model (models/gemma.lua)

-- The families' building pieces (models/family.lua), under the names the
-- family files and scripts have used: pretrained.prenorm, .decoder, .dim, .rope, ...
for k, v in pairs(family) do pretrained[k] = v end

-- Translates a dotted name between anatomy's form and Hugging Face's: layers
-- count from 1 here and from 0 there. With a model whose stack has another
-- name here (models.Llama's blocks are model.layers), that name changes too;
-- without one, the number after `h.` or `layers.` moves.
local function shift(name, by)
  local out = name:gsub('(%f[%w]h%.)(%d+)', function(p, n) return p .. (tonumber(n) + by) end)
  out = out:gsub('(%f[%w]layers%.)(%d+)', function(p, n) return p .. (tonumber(n) + by) end)
  return out
end
local function escape(s) return (s:gsub('%p', '%%%0')) end
-- models.hf_name(name[, model]) -> Hugging Face's name ('h.1.attn' -> 'h.0.attn')
function pretrained.hf_name(name, model)
  local stack = model and model.hf_stack
  if stack then
    local n, rest = name:match('^' .. escape(stack[1]) .. '%.(%d+)(.*)$')
    if n then return stack[2] .. '.' .. (tonumber(n) - 1) .. rest end
    return name
  end
  return (shift(name, -1))
end
-- models.anatomy_name(hf[, model]) -> anatomy's name ('h.0.attn' -> 'h.1.attn')
function pretrained.anatomy_name(hf, model)
  local stack = model and model.hf_stack
  if stack then
    local n, rest = hf:match('^' .. escape(stack[2]) .. '%.(%d+)(.*)$')
    if n then return stack[1] .. '.' .. (tonumber(n) + 1) .. rest end
    return hf
  end
  return (shift(hf, 1))
end

-- The weights of a folder, opened but not read: model.safetensors, or the
-- shards that model.safetensors.index.json lists. Returns {name = the
-- torch.safe_open file that holds it} and how to name the weights in an
-- error; each tensor is read when it is placed.
local function open_weights(folder, where)
  local single, index = folder .. '/model.safetensors', folder .. '/model.safetensors.index.json'
  local files = {}
  if fs.exists(single) then
    local f = torch.safe_open(single)
    for _, name in ipairs(f:keys()) do files[name] = f end
    return files, ("the weights in '%s'"):format(single)
  end
  if not fs.exists(index) then
    if hub.has_pickle(function(f) return fs.exists(folder .. '/' .. f) end) then
      error(hub.pickle_refusal(where, ("'%s'"):format(folder)), 0)
    end
    error(("%s: '%s' has neither model.safetensors nor model.safetensors.index.json"):format(where, folder), 0)
  end
  local ok, idx = pcall(json.decode, fs.read(index))
  if not ok or type(idx) ~= 'table' or type(idx.weight_map) ~= 'table' then
    error(("%s: '%s' is not a safetensors index (no weight_map)"):format(where, index), 0)
  end
  local shards, names = {}, {}
  for name, file in pairs(idx.weight_map) do names[#names + 1] = name; shards[file] = shards[file] or name end
  table.sort(names)
  local opened = {}
  for _, name in ipairs(names) do
    local file = idx.weight_map[name]
    local path = folder .. '/' .. file
    if not opened[file] then
      if not fs.exists(path) then
        error(("%s: the shard '%s' that %s lists for %s is missing"):format(where, file, index, shards[file]), 0)
      end
      opened[file] = torch.safe_open(path)
      opened[file .. '\0names'] = {}
      for _, n in ipairs(opened[file]:keys()) do opened[file .. '\0names'][n] = true end
    end
    if not opened[file .. '\0names'][name] then
      error(("%s: the index puts %s in '%s', which does not hold it"):format(where, name, path), 0)
    end
    files[name] = opened[file]
  end
  return files, ("the weights in the shards '%s' lists"):format(index)
end

-- The dtype a checkpoint is stored in (dtype = 'auto'): config.json's
-- `dtype` (transformers 5) or `torch_dtype`, as transformers reads it first;
-- else the floating dtype that holds most of the weights' elements; float32
-- for any other (float64: anatomy's dtypes are these three).
local stored_dtypes = {float32 = true, bfloat16 = true, float16 = true}
local function stored_dtype(config, files)
  local said = type(config.dtype) == 'string' and config.dtype or config.torch_dtype
  if stored_dtypes[said] then return said end
  local count = {}
  for name, f in pairs(files) do
    local k = 1
    for _, d in ipairs(f:shape(name)) do k = k * d end
    local dt = f:dtype(name)
    count[dt] = (count[dt] or 0) + k
  end
  local best, most = 'float32', -1
  for _, dt in ipairs{'float32', 'bfloat16', 'float16'} do
    if (count[dt] or 0) > most then best, most = dt, count[dt] or 0 end
  end
  return best
end

-- Where a checkpoint is: a local folder as given, else a Hub repository id
-- fetched into huggingface_hub's cache (io/hub.lua). Returns the folder and,
-- for the Hub, the snapshot (its repo_id, revision and commit).
function pretrained.locate(name, opts, where, fetch)
  if type(name) ~= 'string' then error(('%s: name must be a folder or a Hub repository id, got %s'):format(where, type(name)), 3) end
  local hub_only = {'revision', 'token', 'cache_dir', 'local_files_only'}
  if fs.is_dir(name) then
    for _, k in ipairs(hub_only) do
      if opts[k] ~= nil then
        error(("%s: option '%s' is for a Hub repository id, and '%s' is a local folder"):format(where, k, name), 3)
      end
    end
    return name
  end
  if fs.exists(name) or name:sub(1, 1) == '/' or name:sub(1, 2) == './' or name:sub(1, 3) == '../' or not hub.is_repo_id(name) then
    error(("%s: '%s' is not a folder%s"):format(where, name, hub.is_repo_id(name) and '' or ' (nor a Hub repository id)'), 3)
  end
  local ok, snap = pcall(fetch, name, {revision = opts.revision, token = opts.token, cache_dir = opts.cache_dir,
    local_files_only = opts.local_files_only, where = where})
  if not ok then error(snap, 3) end
  return snap.folder, snap
end

-- models.from_config(config, {seed}) -> a model of a Hugging Face config
-- (a table as config.json reads, or the path of a config.json or of the
-- folder holding it) with fresh weights, as transformers'
-- AutoModel.from_config: every 2-D weight drawn from N(0,
-- initializer_range) (0.02 unless the config says), biases zero, norms'
-- weights one (the family's F.norm_weight: Gemma's 0). The config is kept (model.hf_config), so save_pretrained
-- writes a checkpoint that from_pretrained and transformers read. seed:
-- torch.manual_seed before the draw.
function pretrained.from_config(config, opts)
  local where = 'models.from_config'
  opts = options.check(opts, {'seed'}, where, 2)
  local source  -- the config file's path, when given one
  if type(config) == 'string' then
    local path = fs.exists(config .. '/config.json') and config .. '/config.json' or config
    if not fs.exists(path) then error(("%s: no config.json at '%s'"):format(where, config), 2) end
    source = path
    local ok, decoded = pcall(json.decode, fs.read(path))
    if not ok or type(decoded) ~= 'table' then error(("%s: '%s' is not valid JSON: %s"):format(where, path, tostring(decoded)), 2) end
    config = decoded
  end
  if type(config) ~= 'table' then error(('%s: config must be a table or the path of a config.json, got %s'):format(where, type(config)), 2) end
  local family = pretrained.families[config.model_type]
  if not family then
    local known = {}
    for k in pairs(pretrained.families) do known[#known + 1] = k end
    table.sort(known)
    error(("%s: model_type '%s' is not supported (supported: %s)"):format(where, tostring(config.model_type), table.concat(known, ', ')), 2)
  end
  local range = config.initializer_range or 0.02
  if type(range) ~= 'number' or not (range > 0) then error(('%s: initializer_range must be a positive number, got %s'):format(where, tostring(range)), 2) end
  local F = require(family)
  local settings = F.check(config, where)
  pretrained.check_size(F, settings, config, source and ("'%s'"):format(source) or 'the config', where)
  if opts.seed ~= nil then torch.manual_seed(opts.seed) end
  local model = native.blocks.without_init(F.build, settings)
  torch.no_grad(function()
    for name, p in model:named_parameters() do
      if p:dim() >= 2 then p:normal_(0, range)
      elseif name:match('norm[^.]*%.weight$') or name:match('ln[^.]*%.weight$') then p:fill_(F.norm_weight or 1)  -- Gemma's: 0 (it scales by 1 + weight)
      else p:zero_() end
    end
  end)
  local copy = {}
  for k, v in pairs(config) do copy[k] = v end
  rawset(model, 'hf_config', copy)
  rawset(model, 'hf_dropout', pretrained.dropout_settings(copy))
  return model
end

-- models.from_pretrained(name, {revision = 'main', dtype = 'float32'|'bfloat16'|'float16'|'auto',
-- device, token, cache_dir, local_files_only, fold_ln, center_writing_weights,
-- center_unembed, fold_value_biases}) -> model, tokenizer (nil when
-- the checkpoint has none). name is a local folder, or a Hub repository id
-- ('EleutherAI/pythia-70m') whose needed files are fetched into
-- huggingface_hub's cache (HF_HUB_CACHE, HF_ENDPOINT, HF_HUB_OFFLINE and
-- HF_TOKEN as Python reads them); revision is a branch, tag or commit. The model is in eval
-- mode; its modules are the library's blocks; model.config is the
-- family's settings and model.hf_config the config.json read. Every tensor is
-- checked (present, placed, shaped) before the model is made, then read from
-- its file and copied into its parameter one at a time: the weights are never
-- held twice. Each parameter is made in its dtype before it is read (dtype
-- 'auto': the checkpoint's, as transformers 5's default: config.json's
-- `dtype` or `torch_dtype`, else the one most of the weights are in), so a
-- bfloat16 or float16 checkpoint loads as it is stored, with no float32 copy
-- (the memory is the file's; docs/pretrained.md). fold_ln, center_writing_weights, center_unembed and
-- fold_value_biases (all off unless given) are TransformerLens's weight
-- processing, done before any dtype conversion (models.process_weights).
function pretrained.from_pretrained(name, opts)
  local where = 'models.from_pretrained'
  opts = options.check(opts, {dtype = true, device = true, revision = true, token = true, cache_dir = true,
    local_files_only = true, fold_ln = true, center_writing_weights = true, center_unembed = true, fold_value_biases = true}, where, 2)
  local processing = process.check(opts, where, 2)  -- checked now, done once the weights are in
  local dtypes = {float32 = 'float32', float = 'float32', fp32 = 'float32', bfloat16 = 'bfloat16', bf16 = 'bfloat16',
    float16 = 'float16', fp16 = 'float16', half = 'float16'}
  if opts.dtype ~= nil and opts.dtype ~= 'auto' and not dtypes[opts.dtype] then
    error(("%s: dtype must be 'float32', 'bfloat16' (or 'bf16'), 'float16' (or 'fp16') or 'auto' (the checkpoint's), got '%s'"):format(
      where, tostring(opts.dtype)), 2)
  end
  for _, k in ipairs{'revision', 'cache_dir'} do
    if opts[k] ~= nil and (type(opts[k]) ~= 'string' or opts[k] == '') then
      error(("%s: %s must be a non-empty string, got %s"):format(where, k, tostring(opts[k])), 2)
    end
  end
  if opts.local_files_only ~= nil and type(opts.local_files_only) ~= 'boolean' then
    error(("%s: local_files_only must be true or false, got %s"):format(where, tostring(opts.local_files_only)), 2)
  end
  local folder, snap = pretrained.locate(name, opts, where, hub.fetch_model)
  local config_path = folder .. '/config.json'
  if not fs.exists(config_path) then error(("%s: '%s' has no config.json"):format(where, folder), 2) end
  local ok, config = pcall(json.decode, fs.read(config_path))
  if not ok or type(config) ~= 'table' then error(("%s: '%s' is not valid JSON: %s"):format(where, config_path, tostring(config)), 2) end
  local family = pretrained.families[config.model_type]
  if not family then
    local known = {}
    for k in pairs(pretrained.families) do known[#known + 1] = k end
    table.sort(known)
    error(("%s: model_type '%s' in %s is not supported (supported: %s)"):format(
      where, tostring(config.model_type), config_path, table.concat(known, ', ')), 2)
  end
  local F = require(family)
  local settings = F.check(config, where)
  local files, weights = open_weights(folder, where)
  local dtype = opts.dtype == 'auto' and stored_dtype(config, files) or dtypes[opts.dtype or 'float32']
  local load_dtype = processing and 'float32' or dtype  -- what the parameters are read in: processing is done in float32
  -- before the plan, as long as the layers
  pretrained.check_size(F, settings, config, ("'%s'"):format(config_path), where, files, weights, load_dtype)
  local plan = F.weights(settings, files)
  local used = {}  -- checkpoint name -> how many parameters take from it
  for _, w in ipairs(plan) do
    if files[w[2]] == nil then
      error(("%s: the checkpoint in '%s' has no tensor %s (for %s)"):format(where, folder, w[2], w[1]), 2)
    end
    used[w[2]] = (used[w[2]] or 0) + 1
  end
  for name in pairs(files) do
    if not used[name] and not (F.ignored and F.ignored(name, settings)) then
      error(("%s: the checkpoint has a tensor anatomy does not place: %s"):format(where, name), 2)
    end
  end
  local model = native.blocks.without_init(F.build, settings)  -- every parameter is filled below
  local params = {}
  for name, p in model:named_parameters() do params[name] = p end
  local function check_shape(w, stored, shape)
    local p = params[w[1]]
    if table.concat(shape, 'x') ~= format.shape(p) then
      local want = p:size()
      if w[3] == true then want = {want[2], want[1]} end
      error(('%s: %s has shape %s in the checkpoint, expected %s for %s%s'):format(where, w[2], table.concat(stored, 'x'),
        table.concat(want, 'x'), w[1], w[3] == true and ' (stored transposed, [in, out])' or (w[3] and ' (after its conversion)' or '')), 3)
    end
  end
  for _, w in ipairs(plan) do  -- shapes first: nothing is read before every one fits
    if not params[w[1]] then error(('%s: internal: the model has no parameter %s'):format(where, w[1]), 2) end
    if w[3] == nil or w[3] == true then  -- converted ones are checked once converted
      local stored = files[w[2]]:shape(w[2])
      check_shape(w, stored, w[3] and {stored[2], stored[1]} or stored)
    end
  end
  -- Every parameter in the dtype it is read in, empty, before any is read.
  -- Built without init, the float32 ones were never written and hold no
  -- memory; freed, they would wait in the CPU pool (torch.cpu.memory_stats)
  -- for a later buffer to fill them: the pool gives them back at once
  local swapped = false
  for _, w in ipairs(plan) do
    local p = params[w[1]]
    if p.dtype ~= load_dtype then
      p.data = torch.empty(p:size(), {dtype = load_dtype, device = p.device})
      swapped = true
    end
  end
  if swapped then torch.cpu.empty_cache() end
  -- A tensor stored as its parameter is (dtype, shape, on the CPU) is read
  -- straight into it. Any other (transposed, fused, another dtype, another
  -- device) is read into one buffer of its stored dtype, made once as large
  -- as the largest of them, and converted from there; a conversion's result
  -- (GPT-NeoX's q, k, v cut from query_key_value) gives its memory back once
  -- copied, not at the next garbage collection. The memory is then the
  -- parameters' and the buffers'
  local function numel(shape) local n = 1 for _, d in ipairs(shape) do n = n * d end return n end
  local function direct(w) return w[3] == nil and files[w[2]]:dtype(w[2]) == params[w[1]].dtype and params[w[1]].device == 'cpu' end
  local most = {}  -- stored dtype -> the elements its buffer holds
  for _, w in ipairs(plan) do
    if not direct(w) then
      local dt = files[w[2]]:dtype(w[2])
      most[dt] = math.max(most[dt] or 0, numel(files[w[2]]:shape(w[2])))
    end
  end
  local buffers = {}
  for dt, n in pairs(most) do buffers[dt] = torch.empty(n, {dtype = dt, device = 'cpu'}) end
  local last_name, last  -- a stored tensor that feeds several parameters is read once
  local none = torch.empty(0)
  torch.no_grad(function()
    for _, w in ipairs(plan) do
      local p, f, name = params[w[1]], files[w[2]], w[2]
      if direct(w) and f:read_into(name, p) then goto placed end
      do
        if name ~= last_name then
          if last then last.data = none end  -- a view of a buffer, or a tensor read alone: its memory back now
          local shape, buffer = f:shape(name), buffers[f:dtype(name)]
          last = buffer and buffer:narrow(1, 1, numel(shape)):view(shape)
          if not (last and f:read_into(name, last)) then last = f:get_tensor(name) end
          last_name = name
        end
        local t = last
        if w[3] == true then t = t:t() elseif w[3] then t = w[3](t) end
        check_shape(w, f:shape(name), t:size())
        p:copy_(t)
        if not rawequal(t, last) then
          t.data = none
          if last:numel() ~= numel(f:shape(name)) then last_name = nil end  -- t was last itself: read it again if needed
        end
      end
      ::placed::
    end
  end)
  if last then last.data = none end
  buffers = nil
  last = nil
  if processing then  -- in float32, before any other dtype
    local ok, err = pcall(process.process_weights, model, processing)
    if not ok then error((tostring(err):gsub('^[^\n]-:%d+: ', '')):gsub('^models%.process_weights', where), 2) end
  end
  if dtype ~= 'float32' then model:to(dtype) end  -- the parameters read in it already stay as they are
  if opts.device then model:to(opts.device) end
  rawset(model, 'hf_config', config)
  rawset(model, 'hf_folder', folder)
  if snap then  -- where it came from, for provenance: the name, the revision asked, the commit it was
    rawset(model, 'hf_source', {repo_id = snap.repo_id, revision = snap.revision, commit = snap.commit, weights = snap.weights_id})
  end
  rawset(model, 'hf_dropout', pretrained.dropout_settings(config))
  model:eval()
  local tok
  if fs.exists(folder .. '/tokenizer.json') or fs.exists(folder .. '/tokenizer.model')
      or (fs.exists(folder .. '/vocab.json') and fs.exists(folder .. '/merges.txt')) then
    tok = data.tokenizer(folder)
    if snap then tok.path = name end
  end
  rawset(model, 'tokenizer', tok)  -- probe.run_with_cache and patching.run take text with it
  return model, tok
end

-- model:save_pretrained(folder) for a model from models.from_pretrained:
-- writes config.json, model.safetensors in Hugging Face's names and layout
-- (the ...ForCausalLM one), and the tokenizer files of the folder it came
-- from, so that transformers loads the model as anatomy has it now (edited or
-- trained). Each file is written atomically, the weights first.
function pretrained.save(model, folder)
  local where = 'save_pretrained'
  local config = rawget(model, 'hf_config')
  if type(config) ~= 'table' then
    error(('%s: %s did not come from models.from_pretrained (it has no Hugging Face config)'):format(where, nn.typename(model)), 3)
  end
  if type(folder) ~= 'string' or folder == '' then error(('%s: folder must be a path, got %s'):format(where, tostring(folder)), 3) end
  if process.describe(model) then
    error(('%s: the weights are processed (%s): transformers would read them as another model (its layer norms have their '
      .. 'own weights, its head no bias); save the model loaded without processing'):format(where, process.describe(model)), 3)
  end
  local F = require(pretrained.families[config.model_type])
  local s = model.config
  local params = {}
  for name, p in model:named_parameters() do params[name] = p:detach():float():cpu() end
  local tensors, fused = {}, {}
  for _, w in ipairs(F.weights(s, nil)) do
    local t = params[w[1]]
    if w[3] == true then
      tensors[w[2]] = t:t():contiguous()
    elseif w[3] then  -- parts of one stored tensor (GPT-NeoX's query_key_value)
      fused[w[2]] = fused[w[2]] or {}
      table.insert(fused[w[2]], t)
    else
      tensors[w[2]] = t
    end
  end
  for name, parts in pairs(fused) do tensors[name] = F.fuse(s, parts) end
  -- each file is written atomically (fs.write_atomic: temporary file, fsync,
  -- rename), the weights first: a save that fails, most likely on the largest
  -- file, leaves the folder's previous files whole
  fs.mkdir(folder)
  local ok, err = pcall(torch.save_safetensors, folder .. '/model.safetensors', tensors, {format = 'pt'})
  if not ok then error(('%s: %s'):format(where, tostring(err):gsub('^torch%.save_safetensors: ', '')), 3) end
  local cfg = {}
  for k, v in pairs(F.saved_config and F.saved_config(config, s) or config) do cfg[k] = v end  -- Gemma 3's multimodal: its text model's
  cfg.torch_dtype = 'float32'
  local text = json.encode(cfg)
  -- transformers 5 checks a float setting's type: the family's (F.float_keys) keep their point when whole (0.0, not 0)
  for _, k in ipairs(F.float_keys or {}) do
    if type(cfg[k]) == 'number' and cfg[k] % 1 == 0 then text = text:gsub('("' .. k .. '":%-?%d+)([,}])', '%1.0%2') end
  end
  fs.write_atomic(folder .. '/config.json', text .. '\n')
  local from = rawget(model, 'hf_folder')
  for _, file in ipairs{'tokenizer.json', 'tokenizer.model', 'vocab.json', 'merges.txt', 'added_tokens.json', 'tokenizer_config.json', 'special_tokens_map.json',
                        'generation_config.json'} do
    if from and from ~= folder and fs.exists(from .. '/' .. file) then
      fs.write_atomic(folder .. '/' .. file, fs.read(from .. '/' .. file))
    end
  end
  return folder
end

return pretrained
