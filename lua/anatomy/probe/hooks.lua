-- The one way anything attaches to a model: an entry in a module's list
-- `_probes`. An entry acts on the module's output (point == nil: record it,
-- replace it, skip the module) or on the hook points it publishes
-- (entry.hook: record or replace the tensor at each point its match
-- accepts). Captures, interventions, patching, attribution, the autopsy and
-- train.fit's checks all attach through attach() and detach through
-- detach(), so probe.clear removes whatever any of them left.
--
-- What a module carries follows from its list (refresh): _probe, the
-- dispatcher of nn.Module._call, only while an entry acts on its output;
-- _hooks, the dispatcher of self:hook and of a built-in block's explicit
-- path, only while an entry acts on a hook point. A module with no entry
-- pays one branch per call and one table lookup per hook point; a built-in
-- block with no hook entry keeps its fused path.
local torch = require('anatomy.torch')
local points = require('anatomy.probe.points')
local nn = require('anatomy.nn')
local format = require('anatomy.render.format')
local options = require('anatomy.torch.options')
local entries = require('anatomy.probe.entry')
local hooks = {}


-- A module's forward through its output entries: a skip returns the input;
-- else forward, then replacements and records in the order they were attached.
local function run_probes(self, x, ...)
  local probes = rawget(self, '_probes')
  for _, p in ipairs(probes) do
    if p.kind == 'skip' and not p.hook then return x end
  end
  local y = self:forward(x, ...)
  for _, p in ipairs(probes) do
    if not p.hook then
      if p.kind == 'replace' then
        local r = p.fn(y, p.name, x)
        if r ~= nil then y = r end
      elseif p.kind == 'capture' then
        p.record(p.name, y, self)
      end
    end
  end
  return y
end

-- hooks.publish(m, full, t) -> t, or what a replacement puts in its place:
-- the tensor t at the hook point named full (the whole name) through m's
-- hook entries. What something attached to m publishes besides m's own
-- points goes through it (an SAE's features: 'blocks.3.resid_post.sae.acts').
function hooks.publish(m, full, t)
  for _, e in ipairs(rawget(m, '_probes') or {}) do
    if e.hook and e.match(full) then
      if e.kind == 'replace' then
        local r = e.fn(t, full)
        if r ~= nil then
          if not torch.is_tensor(r) then
            error(("probe: the replacement for '%s' is a %s, not a Tensor"):format(full, type(r)), 0)
          end
          if format.shape(r) ~= format.shape(t) then
            error(("probe: the replacement for '%s' has shape %s, expected %s"):format(full, format.shape(r), format.shape(t)), 0)
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

-- The tensor t at hook point `point` of m through its hook entries.
local function dispatch(m, point, t)
  local path = rawget(m, '_hook_path')
  return hooks.publish(m, path == '' and point or path .. '.' .. point, t)
end

-- Sets what m carries from its list of entries (see the top of this file).
-- A point m declares of cost 'asked' (a built-in attention's per-head
-- 'result' (B, T, H, C), H times its output's memory) is computed only when
-- a hook entry asks for it: through e.wants_asked(name) where it has one (a
-- capture: its filter names the point), else through e.match.
local function refresh(m, path)
  local probes = rawget(m, '_probes')
  local outputs, hooked, pattern = false, false, false
  local asked = {}
  for _, p in ipairs(nn.declared_points(m) or {}) do
    if p.cost == 'asked' then asked[#asked + 1] = p.name end
  end
  local wanted, seen = {}, {}
  for _, e in ipairs(probes or {}) do
    if e.hook then
      hooked = true
      for _, a in ipairs(asked) do
        if not seen[a] and (e.wants_asked or e.match)(path == '' and a or path .. '.' .. a) then
          seen[a], wanted[#wanted + 1] = true, a
        end
      end
    else
      outputs = true
    end
    pattern = pattern or e.pattern == true
  end
  if probes and #probes == 0 then rawset(m, '_probes', nil) end
  rawset(m, '_probe', outputs and run_probes or nil)
  rawset(m, '_hooks', hooked and dispatch or nil)
  rawset(m, '_hook_path', hooked and path or nil)
  rawset(m, '_hooks_wanted', hooked and wanted or nil)
  return pattern
end

-- hooks.attach(m, path, entry) -> entry: adds entry to module m (at path in
-- its model), checked by probe/entry.lua (a misspelt or mistyped field is an
-- error naming it). An entry with pattern = true keeps m's attention pattern
-- while it is attached (entry.grad: in the graph).
function hooks.attach(m, path, entry)
  entry = entries.new(entry, 2)
  local probes = rawget(m, '_probes')
  if not probes then
    probes = {}
    rawset(m, '_probes', probes)
  end
  probes[#probes + 1] = entry
  refresh(m, path)
  if entry.pattern and m.keep_pattern then m:keep_pattern(true, entry.grad) end
  return entry
end

-- hooks.detach(m, entry): removes entry from m (again is harmless).
function hooks.detach(m, entry)
  local probes = rawget(m, '_probes')
  if not probes then return end
  for i = #probes, 1, -1 do
    if probes[i] == entry then table.remove(probes, i) end
  end
  local still_pattern = refresh(m, entry.path or rawget(m, '_hook_path') or '')
  if entry.pattern and not still_pattern and m.keep_pattern then m:keep_pattern(false) end
end

local Handle = {}
Handle.__index = Handle

-- An entry as probe.list and a handle's print show it: its kind ('SAE' for a
-- spliced SAE) and where it acts (its point, its module, or the model).
local function kind_and_place(entry, path)
  return entry.sae and 'SAE' or entry.kind or 'probe', entry.label or entry.name or (path ~= '' and path) or 'the model'
end

-- hooks.handle(pairs) -> a handle over {{module, entry}, ...}
function hooks.handle(attached) return setmetatable({attached = attached or {}}, Handle) end

-- print(handle): what it still has attached (an entry probe.clear took
-- out, or handle:remove() did, is no longer listed), each as its kind and
-- where: 'replace at blocks.1.attn.z', 'SAE at blocks.3.resid_post'.
function Handle:__tostring()
  local live = {}
  for _, pair in ipairs(self.attached) do
    local m, entry = pair[1], pair[2]
    for _, p in ipairs(rawget(m, '_probes') or {}) do
      if p == entry then
        live[#live + 1] = ('%s at %s'):format(kind_and_place(entry, entry.path or ''))
        break
      end
    end
  end
  if #live == 0 then return 'probe handle: nothing attached (removed, or cleared by probe.clear)' end
  local shown = {}
  for i = 1, math.min(#live, 6) do shown[i] = live[i] end
  if #live > 6 then shown[#shown + 1] = ('and %d more'):format(#live - 6) end
  return ('probe handle: %s attached (handle:remove() takes %s out)'):format(table.concat(shown, ', '), #live == 1 and 'it' or 'them')
end

-- handle:remove(): detaches what the handle attached (again is harmless).
function Handle:remove()
  for _, pair in ipairs(self.attached) do hooks.detach(pair[1], pair[2]) end
  self.attached = {}
end

-- probe.group{h1, h2, ...} -> one handle that removes them all (interventions
-- compose: attach several, remove them together).
function hooks.group(handles)
  local attached = {}
  for _, h in ipairs(handles) do
    for _, pair in ipairs(h.attached) do attached[#attached + 1] = pair end
    h.attached = {}
  end
  return hooks.handle(attached)
end

local function exact_match(full) return function(n) return n == full end end

-- probe.replace(model, name, fn) -> handle. fn(activation, name, input)
-- returns the activation to use instead (nil keeps it): zero- or
-- mean-ablation, or patching in an activation from another run.
-- On a hook point ('blocks.1.attn.z') fn(t, name) is called with the tensor
-- there; what it returns (nil keeps t) must have t's shape.
function hooks.replace(model, name, fn)
  if type(name) ~= 'string' then error(('probe.replace: name must be a string, got %s'):format(type(name)), 2) end
  if type(fn) ~= 'function' then error('probe.replace: the third argument must be a function', 2) end
  local m, path, point = points.locate(model, name, 2)
  if point then
    local full = path == '' and point or path .. '.' .. point
    return hooks.handle{{m, hooks.attach(m, path, {kind = 'replace', hook = true, path = path, label = full, match = exact_match(full), fn = fn})}}
  end
  return hooks.handle{{m, hooks.attach(m, path, {kind = 'replace', name = path, path = path, fn = fn})}}
end

-- probe.skip(model, name) -> handle: the block returns its input (layer removal).
function hooks.skip(model, name)
  local m = points.module(model, name)
  return hooks.handle{{m, hooks.attach(m, name, {kind = 'skip', name = name, path = name})}}
end

-- probe.idle(model, name) -> handle: a probe that does nothing (what a
-- module pays for carrying probes while none acts; bench/ measures it).
function hooks.idle(model, name)
  local m = points.module(model, name)
  return hooks.handle{{m, hooks.attach(m, name, {kind = 'idle', name = name, path = name})}}
end

-- probe.watch(model, fn) -> handle: fn(name, output, module) after every
-- module's forward (the model's own output excepted), in the order they
-- finish; it changes nothing (train.fit finds the first non-finite output
-- with it).
function hooks.watch(model, fn)
  local handle = hooks.handle()
  for name, m in model:named_modules() do
    if name ~= '' then
      handle.attached[#handle.attached + 1] = {m, hooks.attach(m, name, {kind = 'capture', name = name, path = name, record = fn})}
    end
  end
  return handle
end

-- probe.clear(model): removes everything attached to the model and its
-- modules, by whatever attached it: probes on module outputs (captures,
-- replacements, skips, idle ones, watches) and on hook points
-- (interventions on 'blocks.1.attn.z', captures of them), with the patterns
-- kept for them. The handles they returned then print as empty, and their
-- remove() is harmless.
function hooks.clear(model)
  for _, m in model:named_modules() do
    local probes = rawget(m, '_probes')
    if probes then
      for i = #probes, 1, -1 do hooks.detach(m, probes[i]) end
    end
  end
end

-- probe.list(model) -> {{kind, at, scoped, path}, ...}: everything attached
-- to the model and its modules, in module order: kind 'replace' (an
-- ablation, a patch, a steering vector, probe.replace), 'skip', 'SAE',
-- 'capture', 'idle'; at: the point or module; scoped: attached for a
-- probe.with or run_with_hooks that removes it on return.
function hooks.list(model)
  if not nn.is_module(model) then error(('probe.list: model must be a model, got %s'):format(nn.typename(model)), 2) end
  local out = {}
  for name, m in model:named_modules() do
    for _, e in ipairs(rawget(m, '_probes') or {}) do
      local kind, at = kind_and_place(e, name)
      out[#out + 1] = {kind = kind, at = at, scoped = e.scoped == true, path = name}
    end
  end
  return out
end

-- hooks.describe(list[, most]) -> 'replace at blocks.1.attn.z, skip at blocks.2' (and N more)
function hooks.describe(list, most)
  most = most or 6
  local shown = {}
  for i = 1, math.min(#list, most) do shown[i] = ('%s at %s'):format(list[i].kind, list[i].at) end
  if #list > most then shown[#shown + 1] = ('and %d more'):format(#list - most) end
  return table.concat(shown, ', ')
end

-- The analysis functions (registered by hooks.analysis): one running further
-- up the stack has checked the model already and attaches its own entries.
local analysis_functions = setmetatable({}, {__mode = 'k'})

-- probe.analysis(fn) -> fn, marked as an analysis that assumes the model as
-- it is, without forgotten interventions (hooks.require_clean).
function hooks.analysis(fn)
  if type(fn) ~= 'function' then error(('probe.analysis: fn must be a function, got %s'):format(type(fn)), 2) end
  analysis_functions[fn] = true
  return fn
end

-- probe.require_clean(model, where, level): an error at `level` when
-- something that changes the model's output (a replacement, a skip; an
-- attached SAE is meant to and counts as the model) was attached outside
-- probe.with or run_with_hooks, naming it: an analysis of a model with a
-- forgotten ablation measures the ablated model. Inside another analysis
-- (its own patches attached) it checks nothing.
function hooks.require_clean(model, where, level)
  if not nn.is_module(model) then error(('probe.require_clean: model must be a model, got %s'):format(nn.typename(model)), 2) end
  if type(where) ~= 'string' then error(('probe.require_clean: where must be a string, got %s'):format(type(where)), 2) end
  if level ~= nil and (type(level) ~= 'number' or level % 1 ~= 0 or level < 1 or level > 50) then
    error(('probe.require_clean: level must be a whole number in 1..50, got %s'):format(tostring(level)), 2)
  end
  for l = (level or 2) + 1, 60 do
    local info = debug.getinfo(l, 'f')
    if not info then break end
    if analysis_functions[info.func] then return end
  end
  local live = {}
  for _, e in ipairs(hooks.list(model)) do
    if (e.kind == 'replace' or e.kind == 'skip') and not e.scoped then live[#live + 1] = e end
  end
  if #live == 0 then return end
  error(("%s: the model has %s attached, so this would measure the changed model; remove %s (handle:remove(), or "
    .. "probe.clear(model)), or run this inside probe.with(handles, fn) to mean it"):format(where, hooks.describe(live),
    #live == 1 and 'it' or 'them'), (level or 2) + 1)
end

-- probe.with(handles, fn) -> fn's results: runs fn with what the handles
-- attached (a handle, or a list of them: probe.ablate(...), probe.replace(...),
-- steering, SAEs) and removes all of it when fn returns or raises, as
-- TransformerLens's `with model.hooks(...)`. Analyses inside fn (patching,
-- detectors, lenses, the autopsy, evaluate) accept what the handles attached.
function hooks.with(handles, fn)
  if type(fn) ~= 'function' then error(('probe.with: the second argument must be a function, got %s'):format(type(fn)), 2) end
  if getmetatable(handles) == Handle then handles = {handles} end
  if type(handles) ~= 'table' then error(('probe.with: handles must be a handle or a list of them, got %s'):format(type(handles)), 2) end
  for i, h in ipairs(handles) do
    if getmetatable(h) ~= Handle then
      for _, other in ipairs(handles) do if getmetatable(other) == Handle then other:remove() end end
      error(('probe.with: handles[%d] is a %s, not a handle (probe.replace, probe.ablate, ... return one)'):format(i, type(h)), 2)
    end
    for _, pair in ipairs(h.attached) do pair[2].scoped = true end
  end
  local results = {pcall(fn)}
  for _, h in ipairs(handles) do h:remove() end
  if not results[1] then error(results[2], 0) end
  return unpack(results, 2)
end

-- probe.attach_capture(model, {filter, grad, strict, where, level}) -> capture,
-- handle, order, groups: records into capture until handle:remove(); order
-- lists the names in the order they were recorded. The filter is in any
-- spelling (points.expand_filter); strict: an entry that can match nothing
-- is an error in `where`'s name, and groups let points.check_hits say which
-- entry recorded nothing. Module outputs and hook points alike: a built-in
-- block's points only when the filter asks for one of them (each asked-for
-- point switches it to its explicit path), a Lua block's whenever the filter
-- may match a name it passes to self:hook. Used by probe.capture,
-- probe.run_with_cache, the autopsy and train.fit.
function hooks.attach_capture(model, opts)
  opts = opts or {}
  local filter, groups = points.expand_filter(model, opts.filter, opts.where or 'probe.attach_capture', (opts.level or 1) + 1,
    opts.strict)
  local want = points.matcher(filter)
  -- a point of cost 'asked' (an attention's per-head result) only where the
  -- filter names it (its last part: 'h.1.attn.result', '*.result'), as
  -- TransformerLens's use_attn_result: everything else a cache holds costs
  -- ~1.06x a forward (GPT-2 small, 8x256), every head's result alone as much again
  local asked_names, asked = {}, {}
  for _, m in model:named_modules() do
    for _, p in ipairs(nn.declared_points(m) or {}) do
      if p.cost == 'asked' then asked_names[p.name] = true end
    end
  end
  for _, f in ipairs(type(filter) == 'table' and filter or {}) do
    if asked_names[f:match('([^%.]+)$')] then asked[#asked + 1] = f end
  end
  local wants_asked = points.matcher(asked)
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
  local handle = hooks.handle()
  for name, m in model:named_modules() do
    local kept_pattern = m.keep_pattern ~= nil and name ~= '' and want(name .. '.pattern')
    local out = name ~= '' and want(name)
    if out or kept_pattern then
      local entry = {kind = 'capture', name = name, path = name, grad = grad, pattern = kept_pattern,
        record = out and record or function(n, _, mod) return record(n, {}, mod) end}
      handle.attached[#handle.attached + 1] = {m, hooks.attach(m, name, entry)}
    end
    local declared = points.declared(m)
    local prefix = name == '' and '' or name .. '.'
    local hooked = false
    if declared then
      for _, p in ipairs(declared) do
        -- an attention's pattern comes from keep_pattern (above): the fused path is not needed for it alone
        if want(prefix .. p) and not (p == 'pattern' and kept_pattern) then hooked = true end
      end
    elseif not nn.is_instance(m, nn.Native) then
      hooked = globbed or exact[name] == true
    end
    if hooked then
      local entry = {kind = 'capture', hook = true, path = name, record = keep, wants_asked = wants_asked,
        match = function(full) return want(full) and not (kept_pattern and full == prefix .. 'pattern') end}
      handle.attached[#handle.attached + 1] = {m, hooks.attach(m, name, entry)}
    end
  end
  return capture, handle, order, groups
end

-- probe.capture(model, {filter = {'blocks.*', '*.pattern'}, grad = false}, fn)
-- -> capture, fn's results. Runs fn() with the probes attached: capture[name]
-- is each matching module's output (detached unless grad = true) and, with
-- grad = true, capture.grads[name] its gradient once fn has run backward.
function hooks.capture(model, opts, fn)
  if type(fn) ~= 'function' then error('probe.capture: the third argument must be a function', 2) end
  opts = options.check(opts, {'filter', 'grad'}, 'probe.capture', 2)
  local capture, handle, order, groups = hooks.attach_capture(model, {filter = opts.filter, grad = opts.grad, strict = true,
    where = 'probe.capture', level = 2})
  local results = {pcall(fn)}
  handle:remove()
  if not results[1] then error(results[2], 0) end
  points.check_hits(model, groups, order, 'probe.capture', 2)
  return capture, unpack(results, 2)
end

return hooks
