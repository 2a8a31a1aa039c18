-- nn.Module: the protocol every block follows. Children and parameters are
-- registered by assigning fields (self.fc = nn.Linear(...), self.w =
-- nn.Parameter(t)), in definition order; names are dotted paths with 1-based
-- indices for numbered children (blocks.3.attn.weight), which are m[3].
-- Assigning a field or m[i] again replaces the child in place.
-- The model protocol (docs/model.md, "Your own model"): forward(ids) -> logits is all
-- a model needs; layers() gives the autopsy its rows, readout(h) the logit
-- lens, context() the sequence length, and an attention block's
-- keep_pattern(keep, grad) / pattern() its entropy and maps. Each has a
-- default (below, and nn.Sequential's readout); what is missing, the autopsy
-- says under its table.
local torch = require('anatomy.torch')
local nn = require('anatomy.nn')
local format = require('anatomy.render.format')

local Module = nn.class('nn.Module')
nn.Module = Module

-- Tensors marked by nn.Parameter (weak keys: marking keeps nothing alive).
local marked = setmetatable({}, {__mode = 'k'})

-- nn.Parameter(t): t as a trainable parameter; assigned to a module field, it registers.
function nn.Parameter(t)
  assert(torch.is_tensor(t), 'nn.Parameter expects a Tensor')
  if not t.requires_grad then t = t:detach():requires_grad_() end
  marked[t] = true
  return t
end

-- nn.is_module(v) -> whether v is an nn.Module (an instance of any module class)
function nn.is_module(v) return nn.is_instance(v, Module) end

function Module:__init()
  rawset(self, '_children', {})     -- child names, in definition order
  rawset(self, '_params', {})       -- parameter names, in definition order
  rawset(self, '_param_values', {}) -- name -> tensor (for names that are not fields)
  rawset(self, 'training', true)
end

-- A plain Lua table holding modules (not registered: its parameters would be missed).
local function holds_modules(v)
  if type(v) ~= 'table' or getmetatable(v) ~= nil then return false end
  for _, x in pairs(v) do if nn.is_module(x) then return true end end
  return false
end

-- nn.check_forward(m, where, level): an error at construction when a
-- container is given a module it cannot run: one whose class defines no
-- forward, or a holder of modules that is not run itself (nn.ModuleList,
-- nn.ModuleDict).
function nn.check_forward(m, where, level)
  if not nn.is_module(m) then error(('%s is %s, not a module'):format(where, nn.typename(m)), level + 1) end
  if rawget(getmetatable(m), '__no_forward') then
    error(('%s is an %s, which holds modules but does not run them: pass the modules themselves'):format(where, nn.typename(m)), level + 1)
  end
  if m.forward == Module.forward then
    error(('%s (%s) has no forward method: define %s:forward(x)'):format(where, nn.typename(m), nn.typename(m)), level + 1)
  end
end

-- Whether target is root or one of its descendants.
local function reaches(root, target)
  if rawequal(root, target) then return true end
  for _, c in root:named_children() do
    if reaches(c, target) then return true end
  end
  return false
end

-- A module inside itself would make every walk over the model (forward,
-- parameters, the autopsy) recurse without end: an error when it is made.
local function check_no_cycle(self, name, child, level)
  if reaches(child, self) then
    error(("%s: cannot add %s as '%s': it %s, and a model cannot contain itself"):format(nn.typename(self),
      nn.typename(child), tostring(name), rawequal(child, self) and 'is the module itself' or 'contains this module'), level + 1)
  end
end

-- A new field: a module or a marked tensor registers; a plain table of
-- modules is an error (use nn.ModuleList or nn.ModuleDict); anything else is stored.
function Module:_set_field(key, value)
  if type(key) == 'number' and nn.is_module(value) and rawget(self, '_children') then
    check_no_cycle(self, key, value, 3)
    self:add_module(tostring(key), value)
    return
  end
  if type(key) == 'string' and rawget(self, '_children') then
    if holds_modules(value) then
      error(("%s.%s: a plain table of modules is not registered (its parameters would be missed); "
        .. "use nn.ModuleList{...} or nn.ModuleDict{...}"):format(nn.typename(self), key), 3)
    end
    if nn.is_module(value) then
      check_no_cycle(self, key, value, 3)
      self:add_module(key, value)
      return
    elseif torch.is_tensor(value) and marked[value] then
      self:register_parameter(key, value)
      return
    end
  end
  rawset(self, key, value)
end

-- Numbered children live at integer keys (m[3], and #m counts them); others at their name.
local function child_key(name)
  local i = tonumber(name)
  if i and i % 1 == 0 and i >= 1 and tostring(i) == name then return i end
  return name
end
nn.child_key = child_key

local function append_once(list, name)
  for _, n in ipairs(list) do if n == name then return end end
  list[#list + 1] = name
end

-- m:add_module(name, child): registers child under name (a field unless the name has a dot).
function Module:add_module(name, child)
  assert(nn.is_module(child), ('add_module: %s is not a module'):format(nn.typename(child)))
  check_no_cycle(self, name, child, 2)
  name = tostring(name)
  append_once(self._children, name)
  rawset(self, child_key(name), child)
  return child
end

-- m:register_parameter(name, t): t becomes a parameter called name.
function Module:register_parameter(name, t)
  assert(torch.is_tensor(t), ('register_parameter: %s is not a Tensor'):format(type(t)))
  append_once(self._params, name)
  self._param_values[name] = t
  if not name:find('.', 1, true) then rawset(self, name, t) end
  return t
end

-- A parameter's tensor: the field of that name when there is one (a Lua
-- module whose field was given a new tensor uses the new one), else the
-- registered tensor (dotted names, and built-in blocks, which keep none as fields).
local function param_value(self, name)
  if name:find('.', 1, true) then return self._param_values[name] end
  local v = rawget(self, name)
  if v == nil then v = self._param_values[name] end
  return v
end

-- m:forward(...): what the module computes; every class defines it.
function Module:forward()
  error(('%s has no forward method'):format(nn.typename(self)), 2)
end

-- m(x) runs forward. A module with probes attached (lua/anatomy/probe/hooks.lua)
-- has a _probe field; without one, this branch is the whole cost.
function Module:_call(...)
  local p = rawget(self, '_probe')
  if p == nil then return self:forward(...) end
  return p(self, ...)
end

-- self:hook(name, t) -> t, or what a probe puts in its place: a hook point
-- inside a block, which probes name '<block path>.<name>' (lua/anatomy/probe/hooks.lua).
-- A block written in Lua publishes its intermediates this way:
--   function Block:forward(x)
--     x = self:hook('resid_mid', x + self.attn(self.ln1(x)))
--     ...
-- and declares them in Block.declares = {nn.point('resid_mid', nn.layouts.stream), ...}
-- (nn/hook_point.lua; Block.hook_names = {'resid_mid', ...} for stream points) so that
-- probe.names shows them and a misspelt name is an error. Without a probe on
-- the block it costs one table lookup.
function Module:hook(name, t)
  local dispatch = rawget(self, '_hooks')
  if dispatch == nil then return t end
  return dispatch(self, name, t)
end

-- m:hook_points() -> the names of the hook points this block publishes, as
-- its class declares them (nn.declared_points).
function Module:hook_points()
  local out = {}
  for i, p in ipairs(nn.declared_points(self) or {}) do out[i] = p.name end
  return out
end

-- m:layers() -> {{dotted name, module}, ...}: the stack of layers the
-- autopsy gives a row each and training probes by default. This default
-- takes the children of a `blocks` container when the module has one, else
-- those of the largest numbered container below it; nil and the reason when
-- there is none. Models with another shape (models.Funnel) define their own.
function Module:layers()
  local stack, stack_name = rawget(self, 'blocks'), 'blocks'
  if not nn.is_module(stack) then
    stack, stack_name = nil, nil
    for name, m in self:named_modules() do
      if name ~= '' and #m > 0 and (not stack or #m > #stack) then stack, stack_name = m, name end
    end
  end
  if not stack then return nil, ('%s has no stack of layers (define %s:layers())'):format(nn.typename(self), nn.typename(self)) end
  local out = {}
  for name, m in stack:named_children() do out[#out + 1] = {stack_name .. '.' .. name, m} end
  return out
end

-- m:context() -> the longest sequence the model takes: config.seq when it
-- has one, else the shortest learned position table among its embeddings
-- (nn.Embedding's positions), else nil (no limit known). train.fit,
-- train.evaluate, autopsy.run and generate use it when no seq is given.
function Module:context()
  local cfg = rawget(self, 'config')
  if type(cfg) == 'table' and type(cfg.seq) == 'number' then return cfg.seq end
  local shortest
  for _, m in self:named_modules() do
    local pos = rawget(m, '_param_values') and m._param_values.pos_weight
    if nn.Embedding and nn.is_instance(m, nn.Embedding) and torch.is_tensor(pos) then
      shortest = math.min(shortest or math.huge, pos:size(1))
    end
  end
  return shortest
end

-- Iterates (name, child) over direct children, in definition order.
function Module:named_children()
  local i = 0
  return function()
    while true do
      i = i + 1
      local name = self._children[i]
      if name == nil then return nil end
      local child = rawget(self, child_key(name))
      if child ~= nil then return name, child end
    end
  end
end

-- An array of the direct children.
function Module:children()
  local out = {}
  for _, c in self:named_children() do out[#out + 1] = c end
  return out
end

-- An iterator over a list of {name, value} pairs, giving name, value.
local function pairs_of(list)
  local i = 0
  return function()
    i = i + 1
    if list[i] then return list[i][1], list[i][2] end
  end
end

-- Iterates (dotted name, module) over this module ('') and all below it, depth first.
function Module:named_modules(prefix)
  local list = {}
  local function walk(m, p)
    list[#list + 1] = {p, m}
    for name, c in m:named_children() do walk(c, p == '' and name or p .. '.' .. name) end
  end
  walk(self, prefix or '')
  return pairs_of(list)
end

-- Iterates (dotted name, tensor): own parameters first, then each child's.
function Module:named_parameters(prefix)
  local list = {}
  local function walk(m, p)
    for _, name in ipairs(m._params) do
      local t = param_value(m, name)
      if t ~= nil then list[#list + 1] = {p .. name, t} end
    end
    for name, c in m:named_children() do walk(c, p .. name .. '.') end
  end
  walk(self, prefix and prefix .. '.' or '')
  return pairs_of(list)
end

-- An array of all parameters.
function Module:parameters()
  local out = {}
  for _, p in self:named_parameters() do out[#out + 1] = p end
  return out
end

-- m:num_parameters() -> how many numbers the parameters hold (each shared tensor once)
function Module:num_parameters()
  local n = 0
  for _, p in self:named_parameters() do n = n + p:numel() end
  return n
end

-- m:train(mode = true) / m:eval(): sets training on this module and all below.
function Module:train(mode)
  if mode == nil then mode = true end
  for _, m in self:named_modules() do
    rawset(m, 'training', mode)
    if m._set_training then m:_set_training(mode) end
  end
  return self
end

-- m:eval() -> m, in evaluation mode (m:train(false)): dropout off, in every child
function Module:eval() return self:train(false) end

-- m:zero_grad(): clears the gradient of every parameter
function Module:zero_grad()
  for _, p in self:named_parameters() do p.grad = nil end
  return self
end

-- m:state_dict() -> {name = tensor}: detached views of the parameters.
function Module:state_dict()
  local sd = {}
  for name, p in self:named_parameters() do sd[name] = p:detach() end
  return sd
end

-- m:load_state_dict(sd, {strict = true}): copies values into the parameters.
-- Missing, unexpected or wrong-shape names are an error that lists them all.
function Module:load_state_dict(sd, opts)
  local strict = not (opts and opts.strict == false)
  local missing, mismatched, seen = {}, {}, {}
  for name, p in self:named_parameters() do
    local v = sd[name]
    seen[name] = true
    if v == nil then
      missing[#missing + 1] = name
    elseif not torch.is_tensor(v) then
      mismatched[#mismatched + 1] = ('%s (a %s, not a Tensor)'):format(name, type(v))
    elseif format.shape(v) ~= format.shape(p) then
      mismatched[#mismatched + 1] = ('%s (%s in the state dict, %s in the model)'):format(
        name, format.shape(v), format.shape(p))
    end
  end
  local unexpected = {}
  for name in pairs(sd) do if not seen[name] then unexpected[#unexpected + 1] = name end end
  table.sort(unexpected)
  local problems = {}
  if #mismatched > 0 then problems[#problems + 1] = 'wrong shape: ' .. table.concat(mismatched, ', ') end
  if strict and #missing > 0 then problems[#problems + 1] = 'missing: ' .. table.concat(missing, ', ') end
  if strict and #unexpected > 0 then problems[#problems + 1] = 'unexpected: ' .. table.concat(unexpected, ', ') end
  if #problems > 0 then
    error(('load_state_dict of %s failed (%s)'):format(nn.typename(self), table.concat(problems, '; ')), 2)
  end
  torch.no_grad(function()
    for name, p in self:named_parameters() do
      if sd[name] ~= nil then p:copy_(sd[name]) end
    end
  end)
  return self, missing, unexpected
end

-- m:to(device_or_dtype): moves or casts every parameter in place (the tensors
-- keep their identity, so references and optimizers stay valid). A module
-- cannot move to 'meta' (a tensor there is another kind, which keeps no
-- identity with this one): build it there under torch.set_default_device('meta').
function Module:to(what)
  if what == 'meta' then
    error(("%s:to: parameters cannot move to 'meta' in place; build the module under torch.set_default_device('meta') instead"):format(nn.typename(self)), 2)
  end
  for _, p in self:named_parameters() do
    p.data = p:detach():to(what)
    if p.grad ~= nil then p.grad = p.grad:to(what) end
  end
  return self
end

-- m:device() -> the device of the module's first parameter ('cpu', 'cuda:0');
-- the default device (torch.device()) for a module without parameters. The
-- walk stops at that parameter: probes and loops ask this on every call.
function Module:device()
  local function first(m)
    for _, name in ipairs(m._params) do
      local t = param_value(m, name)
      if t ~= nil then return t end
    end
    for _, c in m:named_children() do
      local t = first(c)
      if t ~= nil then return t end
    end
  end
  local p = first(self)
  return p and p.device or torch.device()
end

-- m:save(path): the parameters as a safetensors file (written atomically).
function Module:save(path)
  torch.save_safetensors(path, self:state_dict(), {format = 'anatomy', class = nn.typename(self)})
  return path
end

-- m:load(path, opts): load_state_dict from a safetensors file.
function Module:load(path, opts)
  local sd, meta = torch.load_safetensors(path)
  if meta and meta.format == 'anatomy-checkpoint' then
    error(("'%s' is a training checkpoint (model, optimizer and step), not a weights file: use "
      .. "train.load_checkpoint(path, model[, optimizer]), or train.fit(..., {checkpoint = path, resume = true})"):format(path), 2)
  end
  return self:load_state_dict(sd, opts)
end

-- What tostring shows inside the parentheses; classes override it.
function Module:extra_repr() return '' end

-- nn.format_count(n) -> n with thousands separators ('1,611,329'; render/format.lua's)
nn.format_count = format.count
local count = format.count

local function own_shapes(m)
  local parts = {}
  for _, name in ipairs(m._params) do
    local t = param_value(m, name)
    if t then parts[#parts + 1] = name .. ' ' .. format.shape(t) end
  end
  return table.concat(parts, ', ')
end

-- What is attached to the model (probe.list), as print(model)'s last
-- line: nothing when nothing is, or the probe library is not loaded.
local function attached_line(model)
  local hooks = package.loaded['anatomy.probe.hooks']
  if not hooks then return nil end
  local list = hooks.list(model)
  if #list == 0 then return nil end
  return ('attached: %s (probe.list(model); probe.clear(model) removes everything)'):format(hooks.describe(list))
end

-- The module tree, like PyTorch's print(model), with parameter shapes and
-- counts; runs of identical numbered children print once ("(1-12): 12 x ...").
-- At the top, a last line lists what probes, interventions and SAEs are
-- attached.
function Module:tostring(indent)
  if indent == nil then
    local tree = self:tostring('')
    local line = attached_line(self)
    return line and (tree .. '\n' .. line) or tree
  end
  local n = self:num_parameters()
  local count_note = n > 0 and ('  -- ' .. count(n) .. ' params') or ''
  if #self._children == 0 then
    local shapes = own_shapes(self)
    return nn.typename(self) .. '(' .. self:extra_repr() .. ')' .. count_note .. (shapes ~= '' and (': ' .. shapes) or '')
  end
  local extra = self:extra_repr()
  local lines = {nn.typename(self) .. (extra ~= '' and ('(' .. extra .. ')') or '') .. ' {' .. count_note}
  local entries = {}
  for name, c in self:named_children() do entries[#entries + 1] = {name, c:tostring(indent .. '  ')} end
  local i = 1
  while i <= #entries do
    local j = i
    while j < #entries and tonumber(entries[j + 1][1]) and tonumber(entries[i][1]) and entries[j + 1][2] == entries[i][2] do
      j = j + 1
    end
    local label = j > i and ('(%s-%s): %d x '):format(entries[i][1], entries[j][1], j - i + 1)
      or ('(%s): '):format(entries[i][1])
    lines[#lines + 1] = indent .. '  ' .. label .. entries[i][2]
    i = j + 1
  end
  lines[#lines + 1] = indent .. '}'
  return table.concat(lines, '\n')
end

return Module
