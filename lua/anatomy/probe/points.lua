-- Probe points and their names: every module output is a point named by
-- its dotted path ('blocks.3', 'blocks.3.attn'), and so is every hook point a
-- block publishes ('blocks.3.attn.pattern', 'blocks.3.resid_mid'). A model
-- from models.from_pretrained also answers to its checkpoint's names. Globs
-- ('blocks.*', '*.pattern') select several.
local models = require('anatomy.models')
local nn = require('anatomy.nn')
local options = require('anatomy.torch.options')
local tl = require('anatomy.probe.tl_names')
local roles = require('anatomy.probe.roles')
local points = {}
points.transformer_lens = tl.tables
points.role_child = roles.child
-- A layer's points by name, directly (probe/roles.lua): points.resid(model,
-- 2, 'pre'), points.part(model, 2, 'attn'), points.final_norm(model) ...
points.layer, points.resid, points.part = roles.layer, roles.resid, roles.part
points.output = roles.output  -- what a layer's attention or MLP adds to the stream (points.output(model, 2, 'attn'))
points.final_norm, points.embedding = roles.final_norm, roles.embedding
points.from_transformer_lens = tl.from_transformer_lens
points.transformer_lens_names = tl.transformer_lens_names
points.to_transformer_lens = tl.to_transformer_lens

-- Turns a glob ('blocks.*', '*.pattern') into an anchored Lua pattern.
local function glob(p)
  return '^' .. p:gsub('[%^%$%(%)%%%.%[%]%+%-%?]', '%%%0'):gsub('%*', '.*') .. '$'
end

-- probe.matcher(filter) -> match(name): true when name passes the filter, nil (everything), a glob
-- ('blocks.*') or a list of globs
local function matcher(filter)
  if filter == nil then return function() return true end end
  if type(filter) == 'string' then filter = {filter} end
  local patterns = {}
  for i, f in ipairs(filter) do patterns[i] = glob(f) end
  return function(name)
    for _, p in ipairs(patterns) do if name:match(p) then return true end end
    return false
  end
end
points.matcher = matcher

-- A model from models.from_pretrained also answers to the names of its
-- checkpoint, as a user pastes them from Hugging Face code: the prefixed
-- form `transformer.h.0.attn` is `h.1.attn` here, `model.layers.0.mlp` is
-- `blocks.1.mlp`. A name without the checkpoint's prefix is anatomy's, whose
-- layers count from 1: a layer number 0 there (`h.0.attn`) is an error that
-- gives both spellings, never a silent guess (`h.0` and `h.1` cannot both be
-- the first layer). Returns the anatomy name, or name when nothing matches.
local hf_prefixes = {'transformer.', 'model.', 'gpt_neox.'}
local function checkpoint_prefixed(name)
  for _, p in ipairs(hf_prefixes) do
    if name:sub(1, #p) == p then return p end
  end
  return nil
end

local function module_set(model)
  local names = {}
  for n in model:named_modules() do names[n] = true end
  return names
end

-- probe.checkpoint_spelling(model, anatomy) -> the checkpoint's spelling of an
-- anatomy name ('h.1.attn' -> 'transformer.h.0.attn' for a GPT-2; a Llama's
-- 'blocks.1' -> 'model.layers.0'). The autopsy's rows carry it too.
local function checkpoint_spelling(model, anatomy)
  local hf = models.hf_name(anatomy, model)
  if checkpoint_prefixed(hf) then return hf end
  local prefix = model.hf_prefix or ''
  return prefix .. hf
end
points.checkpoint_spelling = checkpoint_spelling

-- probe.resolve_name(model, name[, level]) -> anatomy's name of a module given in either spelling
-- (the rule above); a layer 0 in anatomy's spelling is an error at `level`.
function points.resolve_name(model, name, level)
  local tl = points.from_transformer_lens(model, name, (level or 1) + 1)
  if tl then return tl end
  if type(name) ~= 'string' or rawget(model, 'hf_config') == nil then return name end
  local names = module_set(model)
  if names[name] then return name end
  if not checkpoint_prefixed(name) and name:find('%f[%w]0%f[%W]') then
    -- anatomy's spelling: the layer one up; the checkpoint's: its own name, prefixed
    local anatomy
    for _, p in ipairs(hf_prefixes) do
      local t = models.anatomy_name(p .. name, model)
      if names[t] or names[t:match('^(.*)%.[^%.]+$') or ''] then anatomy = t break end
    end
    anatomy = anatomy or models.anatomy_name(name, model)
    error(("'%s': anatomy counts layers from 1, so a layer 0 is no anatomy name: write '%s', or the checkpoint's own name '%s'"):format(
      name, anatomy, checkpoint_spelling(model, anatomy)), (level or 1) + 1)
  end
  local candidates = {}
  local p = checkpoint_prefixed(name)
  if p then
    candidates = {name, name:sub(#p + 1)}
  else
    for _, q in ipairs(hf_prefixes) do candidates[#candidates + 1] = q .. name end
  end
  for _, c in ipairs(candidates) do
    local translated = models.anatomy_name(c, model)
    if names[translated] then return translated end
  end
  return name
end

-- Every name a point of the model answers to: probe.names, the points
-- attached entries publish, and the TransformerLens names.
local function every_name(model)
  local out = points.names(model)
  for n, m in model:named_modules() do
    for _, e in ipairs(rawget(m, '_probes') or {}) do
      for _, p in ipairs(e.publishes or {}) do out[#out + 1] = n == '' and p or n .. '.' .. p end
    end
  end
  for _, pair in ipairs(points.transformer_lens_names(model)) do out[#out + 1] = pair[1] end
  return out
end

-- points.missing(model, name, what) -> the message for a name (or glob)
-- that matches nothing: the closest name, and for a layer counted from 0 in
-- anatomy's spelling the same point one layer up in both spellings.
function points.missing(model, name, what)
  local names = every_name(model)
  local set = {}
  for _, n in ipairs(names) do set[n] = true end
  local hint
  if type(name) == 'string' and not name:find('hook_', 1, true) then
    local up = name:gsub('%f[%w](%d+)%f[^%w]', function(d) return tostring(tonumber(d) + 1) end)
    if up ~= name and set[up] and name:find('%f[%w]0%f[^%w]') then
      local tl_name = tl.to_transformer_lens(model, up)
      hint = ("anatomy counts layers from 1: write '%s'%s"):format(up, tl_name and (", or TransformerLens's '" .. tl_name .. "'") or '')
    end
  end
  if not hint then
    local near = options.closest(name, names)
    if near then hint = ("did you mean '%s'?"):format(near) end
  end
  local head = what and ("%s '%s' matches no probe point of %s"):format(what, tostring(name), nn.typename(model))
    or ("no module or hook point named '%s' in %s"):format(tostring(name), nn.typename(model))
  return ("%s%s (probe.names(model) lists them; TransformerLens's names: probe.transformer_lens_names(model))"):format(
    head, hint and ('; ' .. hint) or '')
end

local function no_such(model, name, level)
  error(points.missing(model, name), level + 1)
end

-- points.module(model, name) -> the module at name (either spelling), or an error that lists the names
function points.module(model, name)
  name = points.resolve_name(model, name, 3)
  for n, m in model:named_modules() do
    if n == name then return m end
  end
  no_such(model, name, 3)
end

-- The hook points a module declares (its class's declares or hook_names,
-- nn/hook_point.lua); nil when it declares none (a Lua block may still call
-- self:hook with any name).
-- Besides a block's own, the points that entries attached to it publish
-- (entry.publishes, a list of names relative to the block: an SAE spliced
-- in at 'resid_post' publishes 'resid_post.sae.acts'); they go with the
-- entry when it is removed.
function points.declared(m)
  local points = m:hook_points()
  for _, e in ipairs(rawget(m, '_probes') or {}) do
    for _, p in ipairs(e.publishes or {}) do points[#points + 1] = p end
  end
  if #points == 0 then return nil end
  return points
end

-- The module whose published points include the dotted rest of name
-- ('blocks.3.resid_post.sae.acts': blocks.3, 'resid_post.sae.acts'), or nil.
local function published_by(model, name)
  for n, m in model:named_modules() do
    local prefix = n == '' and '' or n .. '.'
    if name:sub(1, #prefix) == prefix and rawget(m, '_probes') then
      local rest = name:sub(#prefix + 1)
      for _, e in ipairs(rawget(m, '_probes')) do
        for _, p in ipairs(e.publishes or {}) do
          if p == rest then return m, n, rest end
        end
      end
    end
  end
  return nil
end

-- name -> the module that owns it, its path and the hook point ('q'), or the
-- module itself and no point when name is a module. Checkpoint names
-- (transformer.h.0.attn.q) are translated like module names.
local function locate(model, name, level)
  if type(name) ~= 'string' then error(('a probe point name must be a string, got %s'):format(type(name)), level + 1) end
  name = points.from_transformer_lens(model, name, level + 1) or name
  local exact = points.resolve_name(model, name, level + 1)
  for n, m in model:named_modules() do
    if n == exact then return m, n, nil end
  end
  local pm, pn, pp = published_by(model, exact)
  if pm then return pm, pn, pp end
  local base, point = name:match('^(.*)%.([^%.]+)$')
  if not base then base, point = '', name end
  base = base == '' and '' or points.resolve_name(model, base, level + 1)
  for n, m in model:named_modules() do
    if n == base then
      local points = points.declared(m)
      if points then
        local known = false
        for _, p in ipairs(points) do known = known or p == point end
        if not known then
          error(("no hook point '%s' in %s (%s); its hook points: %s"):format(point, base == '' and 'the model' or base,
            nn.typename(m), table.concat(points, ', ')), level + 1)
        end
      elseif nn.is_instance(m, nn.Native) then  -- a built-in block without hook points (Linear, Embedding, ...)
        error(("no hook point '%s' in %s (%s): it has none (its output is the probe point '%s')"):format(
          point, base, nn.typename(m), base), level + 1)
      end
      return m, n, point
    end
  end
  no_such(model, name, level + 1)
end
points.locate = locate

-- probe.canonical(model, name) -> anatomy's full name of a module output or
-- hook point given in either spelling ('transformer.h.0.attn.z' ->
-- 'h.1.attn.z'), or nil and the reason when there is none.
function points.canonical(model, name)
  points.resolve_name(model, name, 2)  -- a layer 0 in anatomy's spelling is an error, not a miss
  local ok, _, path, point = pcall(locate, model, name, 1)
  if not ok then return nil, _ end
  if not point then return path end
  return path == '' and point or path .. '.' .. point
end

-- The layout of a point from its dimensions' names: where heads and positions lie.
local function layout_of(dims, cost)
  local l = {dims = dims, cost = cost}
  for i, d in ipairs(dims) do
    if d == 'head' then l.head = i elseif d == 'pos' then l.pos = i end
  end
  return l
end

-- probe.layout(model, name) -> {head = dim, pos = dim, dims, cost}: where
-- heads and positions lie in the tensor at a point (any spelling), as the
-- block that publishes it declares (nn/hook_point.lua); a module's output,
-- and a point an attached entry publishes, are (batch, pos, ...). A point of
-- a block that declares none is an error at `level`.
function points.layout(model, name, level)
  level = (level or 1) + 1
  if not nn.is_module(model) then
    error(('probe.layout: model must be a model, got %s (probe.layout(model, name))'):format(nn.typename(model)), level)
  end
  local m, path, point = locate(model, name, level)
  if not point then return layout_of({'batch', 'pos'}) end
  local declared = nn.declared_points(m)
  for _, p in ipairs(declared or {}) do
    if p.name == point then return layout_of(p.layout, p.cost) end
  end
  if point == 'pattern' and m.keep_pattern then return layout_of(nn.layouts.pattern) end  -- kept by keep_pattern
  for _, e in ipairs(rawget(m, '_probes') or {}) do
    for _, p in ipairs(e.publishes or {}) do
      if p == point then return layout_of({'batch', 'pos'}) end
    end
  end
  error(("probe.layout: '%s' is a hook point of %s (%s), which declares %s (its class's declares lists each point with its layout)"):format(
    point, path == '' and 'the model' or path, nn.typename(m), declared and 'no layout for it' or 'no hook points'), level)
end

-- probe.names(model) -> every probe point of a model, in order
-- (module outputs, each followed by the hook points its block declares)
function points.names(model)
  local out = {}
  for name, m in model:named_modules() do
    if name ~= '' then out[#out + 1] = name end
    local points = m:hook_points()
    local has_pattern = false
    for _, p in ipairs(points) do
      out[#out + 1] = name == '' and p or name .. '.' .. p
      has_pattern = has_pattern or p == 'pattern'
    end
    if name ~= '' and m.keep_pattern and not has_pattern then out[#out + 1] = name .. '.pattern' end
  end
  return out
end

-- points.pick_layers(model, layers, where, level, low) -> indices into
-- model:layers(), in order: layers nil (every layer), a layer number or
-- name (anatomy's, the checkpoint's or TransformerLens's), or a list of
-- them; low = 0 admits 0 (the embedding) among the numbers. Errors at
-- `level` name `where` and the layers there are. Also returns the layers.
function points.pick_layers(model, layers, where, level, low)
  level, low = (level or 2) + 1, low or 1
  local all, why = model:layers()
  if not all then error(('%s: %s'):format(where, why), level) end
  local chosen = {}
  if layers == nil then
    for i = low, #all do chosen[#chosen + 1] = i end
    return chosen, all
  end
  if type(layers) == 'number' or type(layers) == 'string' then layers = {layers} end
  if type(layers) ~= 'table' or #layers == 0 then
    error(('%s: layers must be a layer number or name, or a list of them, got %s'):format(where, type(layers)), level)
  end
  for _, l in ipairs(layers) do
    local index
    if type(l) == 'number' then
      if l % 1 ~= 0 or l < low or l > #all then
        error(('%s: layer must be in %d..%d%s, got %s'):format(where, low, #all, low == 0 and ' (0: the embedding)' or '', tostring(l)), level)
      end
      index = l
    else
      local resolved = type(l) == 'string' and points.resolve_name(model, l, level)
      for i, entry in ipairs(all) do if entry[1] == resolved then index = i end end
      if not index then
        local names = {}
        for i, entry in ipairs(all) do names[i] = entry[1] end
        error(("%s: no layer '%s' (layers: %s)"):format(where, tostring(l), table.concat(names, ', ')), level)
      end
    end
    chosen[#chosen + 1] = index
  end
  table.sort(chosen)
  return chosen, all
end

-- points.expand_filter(model, filter, where, level, strict) -> the filter in
-- anatomy's names: a name or glob, or a list of them, in any spelling. A
-- TransformerLens name ('blocks.0.hook_resid_post') or glob
-- ('blocks.*.attn.hook_pattern') becomes the anatomy names it matches, for
-- every model; a checkpoint's name (transformer.h.0.attn) becomes anatomy's.
-- Also returns the groups: {{entry, {translated...}}, ...} for
-- points.check_hits. strict: an entry that can match no point is an error
-- at `level` naming the closest (a glob, or a name under a Lua block that
-- declares no hook points, is checked after the forward by check_hits).
function points.expand_filter(model, filter, where, level, strict)
  level = (level or 1) + 1
  if filter == nil then return nil, {} end
  if type(filter) == 'string' then filter = {filter} end
  if type(filter) ~= 'table' then error(('%s: filter must be a name, a glob or a list of them, got %s'):format(where, type(filter)), level) end
  local out, groups = {}, {}
  local names, set, open
  local function known()
    if names then return end
    names, set, open = points.names(model), {}, {}
    for n, m in model:named_modules() do
      set[n] = true
      if not points.declared(m) and not nn.is_instance(m, nn.Native) then open[n] = true end
      for _, e in ipairs(rawget(m, '_probes') or {}) do
        for _, p in ipairs(e.publishes or {}) do names[#names + 1] = n == '' and p or n .. '.' .. p end
      end
    end
    for _, n in ipairs(names) do set[n] = true end
  end
  for i, f in ipairs(filter) do
    if type(f) ~= 'string' then error(('%s: filter[%d] must be a string, got %s'):format(where, i, type(f)), level) end
    local translated = {}
    if f:find('hook_', 1, true) then
      if f:find('*', 1, true) then
        local pattern = glob(f)
        for _, pair in ipairs(points.transformer_lens_names(model)) do
          if pair[1]:match(pattern) then translated[#translated + 1] = pair[2] end
        end
        if #translated == 0 then error(('%s: %s'):format(where, points.missing(model, f, 'the filter entry')), level) end
      else
        local ok, name = pcall(points.from_transformer_lens, model, f, 1)
        if not ok then error(('%s: %s'):format(where, name:gsub('^[^:]*:%d+: ', '')), level) end
        translated[1] = name
      end
    elseif f:find('*', 1, true) then
      translated[1] = f
    else
      local base, last = f:match('^(.*)%.([^%.]+)$')
      local ok, resolved = pcall(points.resolve_name, model, f, 1)
      if not ok then error(('%s: %s'):format(where, resolved:gsub('^[^:]*:%d+: ', '')), level) end
      if resolved ~= f or not base then
        translated[1] = resolved
      else
        local ok2, b = pcall(points.resolve_name, model, base, 1)
        translated[1] = (ok2 and b or base) .. '.' .. last  -- a hook point of a checkpoint-named module
      end
      if strict then
        known()
        local t = translated[1]
        local owner = t:match('^(.*)%.[^%.]+$') or ''
        if not set[t] and not open[owner] then error(('%s: %s'):format(where, points.missing(model, f, 'the filter entry')), level) end
      end
    end
    for _, t in ipairs(translated) do out[#out + 1] = t end
    groups[#groups + 1] = {f, translated}
  end
  return out, groups
end

-- points.check_hits(model, groups, recorded, where, level): an error naming
-- the closest point for the first filter entry that matched none of the
-- names a run recorded.
function points.check_hits(model, groups, recorded, where, level)
  for _, g in ipairs(groups) do
    local hit = false
    for _, t in ipairs(g[2]) do
      local pattern = glob(t)
      for _, n in ipairs(recorded) do
        if n:match(pattern) then hit = true break end
      end
      if hit then break end
    end
    if not hit then error(('%s: %s'):format(where, points.missing(model, g[1], 'the filter entry')), (level or 1) + 1) end
  end
end

return points
