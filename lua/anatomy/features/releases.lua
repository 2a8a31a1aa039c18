-- The registry sae.from_pretrained reads: releases -> Hub repository, each
-- SAE id's path in it, and the format (SAELens's conversion_func). Two
-- sources: SAELens's pretrained_saes.yaml (an installed sae-lens's, found
-- without running Python, or a YAML file the user names), then anatomy's
-- own entries for releases SAELens lacks. An entry, as SAELens's YAML has it:
--   release: {repo_id, model, conversion_func, config_overrides,
--             saes = {{id, path, norm_scaling_factor, neuronpedia, l0}, ...}}
local options = require('anatomy.torch.options')
local fs = require('anatomy.io.fs')
local native = require('anatomy.torch.native')
local yaml = require('anatomy.io.yaml')
local releases = {}

-- anatomy's own releases: EleutherAI's sparsify SAEs (sparsify's README
-- names this one; its hook points are the model's modules, one folder each)
local function layers(n, fmt)
  local saes = {}
  for i = 0, n - 1 do saes[#saes + 1] = {id = fmt:format(i), path = fmt:format(i)} end
  return saes
end
releases.own = {
  ['sae-llama-3-8b-32x'] = {repo_id = 'EleutherAI/sae-llama-3-8b-32x', model = 'meta-llama/Meta-Llama-3-8B',
    conversion_func = 'sparsify', saes = layers(32, 'layers.%d')},
}

-- Where an installed sae-lens keeps its registry, looked for in this order
-- (no Python is run: importing sae_lens takes seconds): $ANATOMY_SAE_REGISTRY
-- (the file itself), then the sae_lens package of $VIRTUAL_ENV, $CONDA_PREFIX,
-- ~/.local and the system's Python folders.
function releases.saelens_candidates()
  local out = {}
  local env = os.getenv('ANATOMY_SAE_REGISTRY')
  if env and env ~= '' then out[#out + 1] = env end
  local roots = {os.getenv('VIRTUAL_ENV'), os.getenv('CONDA_PREFIX'), (os.getenv('HOME') or '') .. '/.local', '/usr/local', '/usr'}
  for _, root in ipairs(roots) do
    if root and root ~= '' and fs.is_dir(root .. '/lib') then
      for _, name in ipairs(fs.list(root .. '/lib')) do
        if name:match('^python3[%.%d]*$') then
          for _, sub in ipairs{'site-packages', 'dist-packages'} do
            out[#out + 1] = ('%s/lib/%s/%s/sae_lens/pretrained_saes.yaml'):format(root, name, sub)
          end
        end
      end
    end
  end
  out[#out + 1] = '/usr/lib/python3/dist-packages/sae_lens/pretrained_saes.yaml'
  return out
end

local parsed = {}  -- path -> {size, registry}: SAELens's file is 44k lines, read once per process

local function check_entry(release, e, path, where)
  local function bad(why) error(("%s: %s: release '%s' %s"):format(where, path, tostring(release), why), 0) end
  if type(e) ~= 'table' then bad('is not a table') end
  if type(e.repo_id) ~= 'string' then bad('has no repo_id') end
  if type(e.saes) ~= 'table' then bad("has no list 'saes'") end
  -- null (SAELens's own format): no conversion_func
  if e.conversion_func ~= nil and type(e.conversion_func) ~= 'string' then
    if e.conversion_func ~= yaml.null then bad('has a conversion_func that is not a name') end
    e.conversion_func = nil
  end
  for i, s in ipairs(e.saes) do
    if type(s) ~= 'table' or s.id == nil or s.path == nil then bad(('has an entry %d of saes without id and path'):format(i)) end
  end
end

-- releases.read(path, where) -> {release = entry}: a registry YAML file, checked
function releases.read(path, where)
  if not fs.exists(path) then error(("%s: registry '%s' does not exist"):format(where, path), 0) end
  local size = native.file_size(path)
  local hit = parsed[path]
  if hit and hit.size == size then return hit.registry end
  local ok, data = pcall(yaml.read, path)
  if not ok then error(('%s: registry %s: %s'):format(where, path, tostring(data)), 0) end
  if type(data) ~= 'table' then error(('%s: registry %s is not a mapping of releases'):format(where, path), 0) end
  for release, e in pairs(data) do check_entry(release, e, path, where) end
  parsed[path] = {size = size, registry = data}
  return data
end

-- releases.find(registry_path, where) -> entries (release -> entry, with
-- .source), the file read (nil without one): the named file, else an
-- installed sae-lens's, then anatomy's own entries where those lack a name
function releases.find(registry_path, where)
  local path, looked = registry_path, nil
  if not path then
    looked = releases.saelens_candidates()
    for _, p in ipairs(looked) do
      if fs.exists(p) then path = p; break end
    end
  end
  local all = {}
  if path then
    for release, e in pairs(releases.read(path, where)) do all[release] = {entry = e, source = path} end
  end
  for release, e in pairs(releases.own) do
    if not all[release] then all[release] = {entry = e, source = "anatomy's own entries"} end
  end
  return all, path, looked
end

local function sorted_keys(t)
  local out = {}
  for k in pairs(t) do out[#out + 1] = tostring(k) end
  table.sort(out)
  return out
end

-- releases.resolve(release, sae_id, registry_path, where) -> entry, sae
-- (the entry's row for sae_id), source; a release or id that matches nothing
-- is an error naming the closest
function releases.resolve(release, sae_id, registry_path, where)
  local all, path, looked = releases.find(registry_path, where)
  local hit = all[release]
  if not hit then
    local names = sorted_keys(all)
    local near = options.closest(release, names)
    local whence = path and ("is in neither the registry %s nor anatomy's own entries"):format(path)
      or ("is not in anatomy's own entries, and no sae-lens registry was found (give {registry = 'pretrained_saes.yaml'} "
        .. 'or set ANATOMY_SAE_REGISTRY; looked for it in: ' .. table.concat(looked, ', ') .. ')')
    error(("%s: release '%s' %s%s"):format(where, tostring(release), whence,
      near and ("; did you mean '%s'?"):format(near)
        or (#names <= 8 and ('; the releases known: ' .. table.concat(names, ', ')) or ('; ' .. #names .. ' releases are known'))), 0)
  end
  local ids = {}
  for _, s in ipairs(hit.entry.saes) do
    if tostring(s.id) == tostring(sae_id) then return hit.entry, s, hit.source end
    ids[#ids + 1] = tostring(s.id)
  end
  local near = options.closest(sae_id, ids)
  error(("%s: release '%s' (%s) has no SAE id '%s'%s"):format(where, release, hit.source, tostring(sae_id),
    near and ("; did you mean '%s'?"):format(near) or (' (its ids: ' .. table.concat(ids, ', ', 1, math.min(#ids, 5))
      .. (#ids > 5 and ', ...' or '') .. ')')), 0)
end

return releases
