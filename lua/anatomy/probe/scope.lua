-- probe.scope: the one way an analysis leaves a model as it found it. It
-- runs a function and puts back, on return and on error, what running it may
-- change: each module's training flag, the hook entries attached meanwhile,
-- the grad mode, each parameter's requires_grad (and .grad when asked), the
-- padding mask and key/value cache generation switches on, and the fields a
-- module's class lists in scoped_fields (nn.MoE's routing: moe:set_routing).
local torch = require('anatomy.torch')
local nn = require('anatomy.nn')
local hooks = require('anatomy.probe.hooks')
local options = require('anatomy.torch.options')

local scope = {}

local allowed = {'mode', 'grads', 'frozen', 'padding', 'kv_cache'}

-- probe.scope(model, fn, {mode, grads, frozen, padding, kv_cache}) -> fn(model)'s
-- results: runs fn and puts the model back as it was, on return and on error:
-- each module's training flag, the entries attached to any of its modules
-- while fn ran (removed; those attached before stay), the fields its class
-- lists in scoped_fields (nn.MoE's routing), the grad mode, each
-- parameter's requires_grad, and with grads = true each parameter's .grad (a
-- backward adds into it). mode = 'eval' or 'train' runs fn in that mode;
-- frozen = true with no parameter requiring a gradient; padding = a (B, T)
-- mask set on the model's blocks for fn (model:set_padding) and taken off
-- after (true: fn sets it, and it is taken off after); kv_cache = true runs
-- fn with the model's key/value cache on (model:kv_cache) and drops it after. The one mechanism the analyses (the
-- autopsy, patching, attribution, edges, lenses, evaluation, generation,
-- steering vectors, the SAEs' training and evaluation) leave a model
-- unchanged by.
function scope.run(model, fn, opts)
  if not nn.is_module(model) then error(('probe.scope: model must be a model, got %s'):format(nn.typename(model)), 2) end
  if type(fn) ~= 'function' then error(('probe.scope: fn must be a function, got %s'):format(type(fn)), 2) end
  opts = options.check(opts, allowed, 'probe.scope', 2)
  if opts.mode ~= nil and opts.mode ~= 'eval' and opts.mode ~= 'train' then
    error(("probe.scope: mode must be 'eval' or 'train', got %s"):format(tostring(opts.mode)), 2)
  end
  if opts.padding ~= nil and opts.padding ~= true and not torch.is_tensor(opts.padding) then
    error(('probe.scope: padding must be a (B, T) mask tensor or true, got %s'):format(tostring(opts.padding)), 2)
  end
  if opts.kv_cache ~= nil and type(opts.kv_cache) ~= 'boolean' then
    error(('probe.scope: kv_cache must be a boolean, got %s'):format(type(opts.kv_cache)), 2)
  end
  local modes, before, fields = {}, {}, {}
  for _, m in model:named_modules() do
    modes[#modes + 1] = {m, rawget(m, 'training')}
    for _, f in ipairs(m.scoped_fields or {}) do fields[#fields + 1] = {m, f, rawget(m, f)} end
    for _, e in ipairs(rawget(m, '_probes') or {}) do before[e] = true end
  end
  local grad_mode = torch.is_grad_enabled()
  local params, wanted, grads = model:parameters(), {}, {}
  for i, p in ipairs(params) do
    wanted[i] = p.requires_grad
    if opts.grads then grads[i] = p.grad and p.grad:clone() or false end
  end
  if opts.frozen then
    for _, p in ipairs(params) do if p.requires_grad then p:requires_grad_(false) end end
  end
  if opts.mode then model:train(opts.mode == 'train') end
  local results = {pcall(function()
    if torch.is_tensor(opts.padding) then model:set_padding(opts.padding) end
    if opts.kv_cache then model:kv_cache(true) end
    return fn(model)
  end)}
  -- each switch off even where the other's failed; the first failure is raised after the rest is put back
  local undone = {true}
  if opts.kv_cache then undone = {pcall(model.kv_cache, model, false)} end
  if opts.padding then
    local cleared = {pcall(model.set_padding, model, nil)}
    if undone[1] then undone = cleared end
  end
  for _, m in model:named_modules() do
    local probes = rawget(m, '_probes')
    if probes then
      for i = #probes, 1, -1 do
        if probes[i] and not before[probes[i]] then hooks.detach(m, probes[i]) end
      end
    end
  end
  for _, pair in ipairs(modes) do
    local m, flag = pair[1], pair[2]
    if rawget(m, 'training') ~= flag then
      rawset(m, 'training', flag)
      if m._set_training then m:_set_training(flag ~= false) end
    end
  end
  for _, t in ipairs(fields) do rawset(t[1], t[2], t[3]) end
  torch.set_grad_enabled(grad_mode)
  for i, p in ipairs(params) do
    if p.requires_grad ~= wanted[i] then p:requires_grad_(wanted[i]) end
    if opts.grads then p.grad = grads[i] or nil end
  end
  if not results[1] then error(results[2], 0) end
  if not undone[1] then error(undone[2], 0) end
  return unpack(results, 2, table.maxn(results))
end

return scope
