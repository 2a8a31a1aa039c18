-- probe: every module output is a probe point named by its dotted path
-- ('blocks.3', 'blocks.3.inner.attn'); attention blocks also publish their
-- attention matrix as '<path>.pattern'. Probes record activations (and their
-- gradients), replace them (ablation, patching) or skip a block (removal).
-- A module with no probe pays one branch per call (nn.Module._call).
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
-- checkpoint, as a user pastes them from Hugging Face or TransformerLens
-- code: `h.0.attn` or `transformer.h.0.attn` is `h.1.attn` here,
-- `model.layers.0.mlp` is `blocks.1.mlp`. A name that is anatomy's already
-- stays as it is (so a bare `h.1` is anatomy's first block; the prefixed form
-- `transformer.h.1` is the checkpoint's second). Returns the anatomy name, or name.
local hf_prefixes = {'transformer.', 'model.', 'gpt_neox.'}
function probe.resolve_name(model, name)
  if type(name) ~= 'string' or rawget(model, 'hf_config') == nil then return name end
  for n in model:named_modules() do if n == name then return name end end
  local candidates = {name}
  for _, p in ipairs(hf_prefixes) do
    if name:sub(1, #p) == p then candidates[#candidates + 1] = name:sub(#p + 1) else candidates[#candidates + 1] = p .. name end
  end
  local names = {}
  for n in model:named_modules() do names[n] = true end
  for _, c in ipairs(candidates) do
    local translated = models.anatomy_name(c, model)
    if names[translated] then return translated end
  end
  return name
end

-- The module at a dotted path, or an error that lists the nearest names.
local function find(model, name)
  name = probe.resolve_name(model, name)
  for n, m in model:named_modules() do
    if n == name then return m end
  end
  local names = {}
  for n in model:named_modules() do if n ~= '' then names[#names + 1] = n end end
  error(("no module named '%s' in %s (probe points: %s)"):format(name, nn.typename(model),
    table.concat(names, ', ', 1, math.min(#names, 12)) .. (#names > 12 and ', ...' or '')), 3)
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

local Handle = {}
Handle.__index = Handle
-- handle:remove(): detaches the probe (again is harmless).
function Handle:remove()
  for _, pair in ipairs(self.attached) do detach(pair[1], pair[2]) end
  self.attached = {}
end

-- probe.replace(model, name, fn) -> handle. fn(activation, name, input)
-- returns the activation to use instead (nil keeps it): zero- or
-- mean-ablation, or patching in an activation from another run.
function probe.replace(model, name, fn)
  if type(fn) ~= 'function' then error('probe.replace: the third argument must be a function', 2) end
  local m = find(model, name)
  return setmetatable({attached = {{m, attach(m, {kind = 'replace', name = name, fn = fn})}}}, Handle)
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

-- probe.clear(model): removes every probe from the model and its modules.
function probe.clear(model)
  for _, m in model:named_modules() do
    if rawget(m, '_probes') then
      for i = #m._probes, 1, -1 do detach(m, m._probes[i]) end
    end
  end
end

-- probe.attach_capture(model, {filter, grad}) -> capture, handle: records
-- into capture until handle:remove(). Used by probe.capture and train.fit.
function probe.attach_capture(model, opts)
  opts = opts or {}
  local filter = opts.filter
  if type(filter) == 'string' then filter = {filter} end
  if type(filter) == 'table' and rawget(model, 'hf_config') then  -- checkpoint names, translated
    local translated = {}
    for i, f in ipairs(filter) do
      local base, pattern = f:match('^(.-)(%.pattern)$')
      translated[i] = f:find('[%*%?]') and f or (base and probe.resolve_name(model, base) .. pattern or probe.resolve_name(model, f))
    end
    filter = translated
  end
  local want = matcher(filter)
  local grad = opts.grad == true
  local capture = {grads = {}}
  local function record(name, y, m)
    if torch.is_tensor(y) then
      if grad and y.requires_grad then
        capture[name] = y
        if y.is_leaf == false then
          y:register_hook(function(g) capture.grads[name] = g end)
        end
      else
        capture[name] = y:detach()
      end
    end
    if want(name .. '.pattern') and m.pattern then
      local pattern = m:pattern()
      if pattern then
        capture[name .. '.pattern'] = grad and pattern or pattern:detach()
        if grad and pattern.requires_grad and pattern.is_leaf == false then
          pattern:register_hook(function(g) capture.grads[name .. '.pattern'] = g end)
        end
      end
    end
  end
  local handle = setmetatable({attached = {}}, Handle)
  for name, m in model:named_modules() do
    local out, pattern = want(name), m.keep_pattern ~= nil and want(name .. '.pattern')
    if name ~= '' and (out or pattern) then
      local entry = {kind = 'capture', name = name, grad = grad, pattern = pattern,
        record = out and record or function(n, y, mod) return record(n, {}, mod) end}
      handle.attached[#handle.attached + 1] = {m, attach(m, entry)}
    end
  end
  return capture, handle
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
function probe.names(model)
  local out = {}
  for name, m in model:named_modules() do
    if name ~= '' then
      out[#out + 1] = name
      if m.keep_pattern then out[#out + 1] = name .. '.pattern' end
    end
  end
  return out
end

return probe
