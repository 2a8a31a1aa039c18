-- probe: every module output is a probe point named by its dotted path
-- ('blocks.3', 'blocks.3.inner.attn'), and so is every hook point inside a
-- block ('blocks.3.attn.q', 'blocks.3.attn.pattern', 'blocks.3.mlp.post',
-- 'blocks.3.resid_mid', 'ln_f.scale'): what a block passes through
-- self:hook(name, t) (nn.Module), the built-in blocks from C++ (their
-- m:hook_points()). Probes record activations (and their gradients), replace
-- them (ablation, patching, a set value; one head or one position), or skip
-- a block (removal). A module with no probe pays one branch per call
-- (nn.Module._call) and one table lookup per hook point; a built-in block
-- with no hook probe keeps its fused path.
local probe = {}

-- Turns a glob ('blocks.*', '*.pattern') into an anchored Lua pattern.
local function glob(p)
  return '^' .. p:gsub('[%^%$%(%)%%%.%[%]%+%-%?]', '%%%0'):gsub('%*', '.*') .. '$'
end

-- A filter: nil (everything), a glob, or a list of globs.
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
probe.matcher = matcher

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
probe.checkpoint_spelling = checkpoint_spelling

-- probe.resolve_name(model, name[, level]) -> anatomy's name of a module given in either spelling
-- (the rule above); a layer 0 in anatomy's spelling is an error at `level`.
function probe.resolve_name(model, name, level)
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

-- The module at a dotted path, or an error that lists the nearest names.
local function module_names(model)
  local names = {}
  for n in model:named_modules() do if n ~= '' then names[#names + 1] = n end end
  return names
end

local function no_such(model, name, level)
  local names = module_names(model)
  error(("no module or hook point named '%s' in %s (modules: %s; a block's hook points: probe.names(model))"):format(
    name, nn.typename(model), table.concat(names, ', ', 1, math.min(#names, 12)) .. (#names > 12 and ', ...' or '')), level + 1)
end

local function find(model, name)
  name = probe.resolve_name(model, name, 3)
  for n, m in model:named_modules() do
    if n == name then return m end
  end
  no_such(model, name, 3)
end

-- The hook points a module declares: a built-in block's (C++), or a Lua
-- class's hook_names; nil when it declares none (a Lua block may still call
-- self:hook with any name).
local function declared_points(m)
  local points = m:hook_points()
  if #points == 0 then return nil end
  return points
end

-- name -> the module that owns it, its path and the hook point ('q'), or the
-- module itself and no point when name is a module. Checkpoint names
-- (transformer.h.0.attn.q) are translated like module names.
local function locate(model, name, level)
  if type(name) ~= 'string' then error(('a probe point name must be a string, got %s'):format(type(name)), level + 1) end
  local exact = probe.resolve_name(model, name, level + 1)
  for n, m in model:named_modules() do
    if n == exact then return m, n, nil end
  end
  local base, point = name:match('^(.*)%.([^%.]+)$')
  if not base then base, point = '', name end
  base = base == '' and '' or probe.resolve_name(model, base, level + 1)
  for n, m in model:named_modules() do
    if n == base then
      local points = declared_points(m)
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
probe._locate = locate

-- probe.canonical(model, name) -> anatomy's full name of a module output or
-- hook point given in either spelling ('transformer.h.0.attn.z' ->
-- 'h.1.attn.z'), or nil and the reason when there is none.
function probe.canonical(model, name)
  probe.resolve_name(model, name, 2)  -- a layer 0 in anatomy's spelling is an error, not a miss
  local ok, _, path, point = pcall(locate, model, name, 1)
  if not ok then return nil, _ end
  if not point then return path end
  return path == '' and point or path .. '.' .. point
end

-- Runs a module's forward through its probes: skip, then forward, then
-- replacements, then captures, in the order they were attached.
local function run_probes(self, x, ...)
  local probes = rawget(self, '_probes')
  for _, p in ipairs(probes) do
    if p.kind == 'skip' then return x end
  end
  local y = self:forward(x, ...)
  for _, p in ipairs(probes) do
    if p.kind == 'replace' then
      local r = p.fn(y, p.name, x)
      if r ~= nil then y = r end
    elseif p.kind == 'capture' then
      p.record(p.name, y, self)
    end
  end
  return y
end

local function attach(m, entry)
  local probes = rawget(m, '_probes')
  if not probes then
    probes = {}
    rawset(m, '_probes', probes)
    rawset(m, '_probe', run_probes)
  end
  probes[#probes + 1] = entry
  if entry.kind == 'capture' and entry.pattern and m.keep_pattern then m:keep_pattern(true, entry.grad) end
  return entry
end

local function detach(m, entry)
  local probes = rawget(m, '_probes')
  if not probes then return end
  for i = #probes, 1, -1 do
    if probes[i] == entry then table.remove(probes, i) end
  end
  local still_pattern = false
  for _, p in ipairs(probes) do still_pattern = still_pattern or (p.kind == 'capture' and p.pattern) end
  if entry.pattern and not still_pattern and m.keep_pattern then m:keep_pattern(false) end
  if #probes == 0 then
    rawset(m, '_probes', nil)
    rawset(m, '_probe', nil)
  end
end

-- Hook points: a module with hook probes has _hook_entries (each with a
-- match(full name), and record or fn) and _hooks, the dispatcher its
-- self:hook calls; a built-in block gets the dispatcher for each forward
-- (nn.Native), with _hooks_wanted naming its costly points ("result").
local function dispatch(m, point, t)
  local path = rawget(m, '_hook_path')
  local full = path == '' and point or path .. '.' .. point
  for _, e in ipairs(rawget(m, '_hook_entries')) do
    if e.match(full) then
      if e.kind == 'replace' then
        local r = e.fn(t, full)
        if r ~= nil then
          if not torch.is_tensor(r) then
            error(("probe: the replacement for '%s' is a %s, not a Tensor"):format(full, type(r)), 0)
          end
          if table.concat(r:size(), 'x') ~= table.concat(t:size(), 'x') then
            error(("probe: the replacement for '%s' has shape %s, expected %s"):format(full, table.concat(r:size(), 'x'),
              table.concat(t:size(), 'x')), 0)
          end
          t = r
        end
      elseif torch.is_tensor(t) then
        e.record(full, t)
      end
    end
  end
  return t
end

-- The points a built-in block computes only when asked: an attention's
-- per-head 'result' (B, T, H, C), H times its output's memory. An entry asks
-- through e.wants_result(name) when it has one (a capture: its filter names
-- the point), else through e.match.
local function refresh_wanted(m)
  local wanted = {}
  local path = rawget(m, '_hook_path')
  local name = (path == '' and '' or path .. '.') .. 'result'
  for _, e in ipairs(rawget(m, '_hook_entries') or {}) do
    if (e.wants_result or e.match)(name) then wanted = {'result'} end
  end
  rawset(m, '_hooks_wanted', wanted)
end

local function attach_hook(m, path, entry)
  local entries = rawget(m, '_hook_entries')
  if not entries then
    entries = {}
    rawset(m, '_hook_entries', entries)
    rawset(m, '_hook_path', path)
    rawset(m, '_hooks', dispatch)
  end
  entries[#entries + 1] = entry
  refresh_wanted(m)
  return entry
end

local function detach_hook(m, entry)
  local entries = rawget(m, '_hook_entries')
  if not entries then return end
  for i = #entries, 1, -1 do
    if entries[i] == entry then table.remove(entries, i) end
  end
  if #entries == 0 then
    rawset(m, '_hook_entries', nil)
    rawset(m, '_hook_path', nil)
    rawset(m, '_hooks', nil)
    rawset(m, '_hooks_wanted', nil)
  else
    refresh_wanted(m)
  end
end

local Handle = {}
Handle.__index = Handle
-- handle:remove(): detaches the probe (again is harmless).
function Handle:remove()
  for _, pair in ipairs(self.attached) do
    if pair[2].hook then detach_hook(pair[1], pair[2]) else detach(pair[1], pair[2]) end
  end
  self.attached = {}
end

-- probe.group{h1, h2, ...} -> one handle that removes them all (interventions
-- compose: attach several, remove them together).
function probe.group(handles)
  local attached = {}
  for _, h in ipairs(handles) do
    for _, pair in ipairs(h.attached) do attached[#attached + 1] = pair end
    h.attached = {}
  end
  return setmetatable({attached = attached}, Handle)
end

local function exact_match(full) return function(n) return n == full end end

-- probe.replace(model, name, fn) -> handle. fn(activation, name, input)
-- returns the activation to use instead (nil keeps it): zero- or
-- mean-ablation, or patching in an activation from another run.
-- On a hook point ('blocks.1.attn.z') fn(t, name) is called with the tensor
-- there; what it returns (nil keeps t) must have t's shape.
function probe.replace(model, name, fn)
  if type(name) ~= 'string' then error(('probe.replace: name must be a string, got %s'):format(type(name)), 2) end
  if type(fn) ~= 'function' then error('probe.replace: the third argument must be a function', 2) end
  local m, path, point = locate(model, name, 2)
  if point then
    local full = path == '' and point or path .. '.' .. point
    local entry = attach_hook(m, path, {kind = 'replace', hook = true, match = exact_match(full), fn = fn})
    return setmetatable({attached = {{m, entry}}}, Handle)
  end
  return setmetatable({attached = {{m, attach(m, {kind = 'replace', name = path, fn = fn})}}}, Handle)
end

-- probe.skip(model, name) -> handle: the block returns its input (layer removal).
function probe.skip(model, name)
  local m = find(model, name)
  return setmetatable({attached = {{m, attach(m, {kind = 'skip', name = name})}}}, Handle)
end

-- probe.idle(model, name) -> handle: a probe that does nothing (what a
-- module pays for carrying probes while none acts; bench/ measures it).
function probe.idle(model, name)
  local m = find(model, name)
  return setmetatable({attached = {{m, attach(m, {kind = 'idle', name = name})}}}, Handle)
end

-- probe.clear(model): removes everything probe.*, patching.* and the
-- attribution functions attached to the model and its modules: probes on
-- module outputs (captures, replacements, skips, idle ones) and probes on
-- hook points (interventions on 'blocks.1.attn.z', captures of them), with
-- the patterns kept for them. The handles they returned become empty.
function probe.clear(model)
  for _, m in model:named_modules() do
    local probes = rawget(m, '_probes')
    if probes then
      for i = #probes, 1, -1 do detach(m, probes[i]) end
    end
    local entries = rawget(m, '_hook_entries')
    if entries then
      for i = #entries, 1, -1 do detach_hook(m, entries[i]) end
    end
  end
end

-- probe.attach_capture(model, {filter, grad}) -> capture, handle, order:
-- records into capture until handle:remove(); order lists the names in the
-- order they were recorded. Module outputs and hook points alike: a built-in
-- block's points only when the filter asks for one of them (each asked-for
-- point switches it to its explicit path), a Lua block's whenever the filter
-- may match a name it passes to self:hook. Used by probe.capture,
-- probe.run_with_cache and train.fit.
function probe.attach_capture(model, opts)
  opts = opts or {}
  local filter = opts.filter
  if type(filter) == 'string' then filter = {filter} end
  if type(filter) == 'table' and rawget(model, 'hf_config') then  -- checkpoint names, translated
    local translated = {}
    for i, f in ipairs(filter) do
      local base, last = f:match('^(.*)%.([^%.]+)$')
      if f:find('[%*%?]') then
        translated[i] = f
      elseif probe.resolve_name(model, f) ~= f or not base then
        translated[i] = probe.resolve_name(model, f)
      else
        translated[i] = probe.resolve_name(model, base) .. '.' .. last  -- a hook point of a checkpoint-named module
      end
    end
    filter = translated
  end
  local want = matcher(filter)
  -- an attention's per-head result only where the filter names it (a last
  -- part 'result': 'h.1.attn.result', '*.result'), as TransformerLens's
  -- use_attn_result: everything else a cache holds costs ~1.06x a forward
  -- (GPT-2 small, 8x256), every head's result alone as much again
  local asked_result = {}
  for _, f in ipairs(type(filter) == 'table' and filter or {}) do
    if f == 'result' or f:sub(-7) == '.result' then asked_result[#asked_result + 1] = f end
  end
  local wants_result = matcher(asked_result)
  local exact = {}  -- a filter of plain names: which modules may own one
  local globbed = filter == nil
  for _, f in ipairs(type(filter) == 'table' and filter or {}) do
    if f:find('[%*%?]') then globbed = true else exact[f:match('^(.*)%.[^%.]+$') or ''] = true end
  end
  local grad = opts.grad == true
  local grads = {}  -- filled by the backward, after the probes are gone
  local capture, order = {grads = grads}, {}
  local function keep(name, t)
    if capture[name] == nil then order[#order + 1] = name end
    if grad and t.requires_grad then
      capture[name] = t
      if t.is_leaf == false then t:register_hook(function(g) grads[name] = g end) end
    else
      capture[name] = t:detach()
    end
  end
  local function record(name, y, m)
    if torch.is_tensor(y) then keep(name, y) end
    if want(name .. '.pattern') and m.pattern then
      local pattern = m:pattern()
      if pattern then keep(name .. '.pattern', pattern) end
    end
  end
  local handle = setmetatable({attached = {}}, Handle)
  for name, m in model:named_modules() do
    local kept_pattern = m.keep_pattern ~= nil and name ~= '' and want(name .. '.pattern')
    local out = name ~= '' and want(name)
    if out or kept_pattern then
      local entry = {kind = 'capture', name = name, grad = grad, pattern = kept_pattern,
        record = out and record or function(n, y, mod) return record(n, {}, mod) end}
      handle.attached[#handle.attached + 1] = {m, attach(m, entry)}
    end
    local points = declared_points(m)
    local prefix = name == '' and '' or name .. '.'
    local hooked = false
    if points then
      for _, p in ipairs(points) do
        -- an attention's pattern comes from keep_pattern (above): the fused path is not needed for it alone
        if want(prefix .. p) and not (p == 'pattern' and kept_pattern) then hooked = true end
      end
    elseif not nn.is_instance(m, nn.Native) then
      hooked = globbed or exact[name] == true
    end
    if hooked then
      local entry = attach_hook(m, name, {kind = 'capture', hook = true, record = keep, wants_result = wants_result,
        match = function(full) return want(full) and not (kept_pattern and full == prefix .. 'pattern') end})
      handle.attached[#handle.attached + 1] = {m, entry}
    end
  end
  return capture, handle, order
end

-- probe.capture(model, {filter = {'blocks.*', '*.pattern'}, grad = false}, fn)
-- -> capture, fn's results. Runs fn() with the probes attached: capture[name]
-- is each matching module's output (detached unless grad = true) and, with
-- grad = true, capture.grads[name] its gradient once fn has run backward.
function probe.capture(model, opts, fn)
  if type(fn) ~= 'function' then error('probe.capture: the third argument must be a function', 2) end
  local capture, handle = probe.attach_capture(model, opts)
  local results = {pcall(fn)}
  handle:remove()
  if not results[1] then error(results[2], 0) end
  return capture, unpack(results, 2)
end

-- probe.names(model) -> every probe point of a model, in order
-- (module outputs, each followed by the hook points its block declares)
function probe.names(model)
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

-- Defined beside this file, on this table: probe.ablate, probe.set,
-- probe.patch, probe.layout (lua/anatomy/probe/interventions.lua);
-- probe.run_with_cache and probe.to_ids (lua/anatomy/probe/cache.lua);
-- probe.logit_attribution (lua/anatomy/probe/attribution.lua).

return probe
