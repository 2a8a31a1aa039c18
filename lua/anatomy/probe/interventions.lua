-- Interventions on any module output or hook point (probe.lua's names): one
-- head, one position, or the whole activation zeroed, replaced by a mean or a
-- resampled value, set, or patched from another run. Each is a replacement
-- (probe.replace) and returns its handle; they compose. probe.ablate,
-- probe.set, probe.patch.
local torch = require('anatomy.torch')
local points = require('anatomy.probe.points')
local hooks = require('anatomy.probe.hooks')
local inputs = require('anatomy.probe.inputs')
local Cache = require('anatomy.probe.cache')
local options = require('anatomy.torch.options')
local format = require('anatomy.render.format')
local interventions = {}


-- The part of t (a view) that opts.head and opts.position select (1-based;
-- a negative position counts from the end) in layout l (points.layout); t
-- itself when neither is given.
local function selection(t, l, name, opts, where)
  local view = t
  if opts.head ~= nil then
    if not l.head then error(("%s: '%s' has no head dimension (heads: q, k, v, rot_q, rot_k, scores, pattern, z, result)"):format(where, name), 4) end
    local H = t:size(l.head)
    if type(opts.head) ~= 'number' or opts.head % 1 ~= 0 or opts.head < 1 or opts.head > H then
      error(('%s: head must be an integer in 1..%d for %s, got %s'):format(where, H, name, tostring(opts.head)), 4)
    end
    view = view:narrow(l.head, opts.head, 1)
  end
  if opts.position ~= nil then
    if t:dim() < l.pos then error(("%s: '%s' has no position dimension"):format(where, name), 4) end
    view = view:narrow(l.pos, inputs.position(opts.position, t:size(l.pos), where, name, 4), 1)
  end
  return view
end

-- How many heads the tensor at a hook point has, when its block says: a
-- built-in attention's num_heads, or a Lua block's `heads` field; nil when
-- unknown (then only the forward's tensor can tell).
local function head_count(m, point)
  if type(m.num_heads) == 'function' then return m:num_heads(point) end
  local h = rawget(m, 'heads')
  return type(h) == 'number' and h or nil
end

-- The longest input the model takes (model:context(), or its config's seq
-- or positions), or nil.
local function context_of(model)
  if type(model.context) == 'function' then
    local ok, n = pcall(model.context, model)
    if ok and type(n) == 'number' then return n end
  end
  local c = rawget(model, 'config')
  if type(c) == 'table' then return c.seq or c.positions end
  return nil
end

-- An intervention's head and position, checked when it is attached: their
-- type, and their range where the block's head count and the model's context
-- tell it (again at each forward, against the tensor there). Returns the
-- anatomy name of the point and its layout (nil when neither is given).
local function check_selection(model, name, opts, where)
  local m, path, point = points.locate(model, name, 3)
  local full = point and (path == '' and point or path .. '.' .. point) or path
  local l
  if opts.head ~= nil or opts.position ~= nil then
    local ok, got = pcall(points.layout, model, full, 1)
    if not ok then error(('%s: %s'):format(where, (tostring(got):gsub('^[^:]*:%d+: ', ''):gsub('^probe%.layout: ', ''))), 3) end
    l = got
  end
  if opts.head ~= nil and not l.head then
    error(("%s: '%s' has no head dimension (heads: q, k, v, rot_q, rot_k, scores, pattern, z, result)"):format(where, full), 3)
  end
  for _, key in ipairs{'head', 'position'} do
    local v = opts[key]
    if v ~= nil and (type(v) ~= 'number' or v % 1 ~= 0 or v == 0 or (key == 'head' and v < 0)) then
      error(('%s: %s must be a %sinteger, got %s'):format(where, key, key == 'head' and 'positive ' or 'non-zero ', tostring(v)), 3)
    end
  end
  local H = opts.head ~= nil and point and head_count(m, point) or nil
  if H and opts.head > H then
    error(('%s: head must be an integer in 1..%d for %s (%s has %d heads), got %d'):format(where, H, full, path, H, opts.head), 3)
  end
  local T = opts.position ~= nil and context_of(model) or nil
  if T and (opts.position > T or opts.position < -T) then
    error(('%s: position must be an integer in 1..%d (or -%d..-1) for %s (the model takes at most %d positions), got %d'):format(
      where, T, T, full, T, opts.position), 3)
  end
  return full, l
end

-- The activation at `name` over a reference batch (ids, or a cache holding it).
local function reference(model, name, over, where)
  if type(over) == 'table' and getmetatable(over) == Cache then
    local t = over:get(name)
    if t == nil then error(("%s: the cache has no '%s' (run probe.run_with_cache with it in the filter)"):format(where, name), 4) end
    return t
  end
  if not torch.is_tensor(over) then error(('%s: over must be ids (B, T) or a cache, got %s'):format(where, type(over)), 4) end
  local _, cache = Cache.run_with_cache(model, over, {filter = name})
  local t = cache:get(name)
  if t == nil then error(("%s: running the reference batch published nothing at '%s'"):format(where, name), 4) end
  return t
end

local function check_batch_shape(t, ref, name, where)
  for d = 2, t:dim() do
    if t:size(d) ~= ref:size(d) then
      error(("%s: '%s' is %s here but %s in the reference batch (only the batch size may differ)"):format(where, name,
        format.shape(t), format.shape(ref)), 0)
    end
  end
end

-- Attaches the replacement every intervention is: at each forward, a copy
-- of the activation t whose selection (opts.head, opts.position; layout l)
-- write(view, t, full) fills in place.
local function replace_selection(model, name, l, opts, where, write)
  return hooks.replace(model, name, function(t, full)
    local out = t:clone()
    write(selection(out, l, full, opts, where), t, full)
    return out
  end)
end

-- probe.ablate(model, name, {kind = 'zero'|'mean'|'resample', over, head,
-- position, seed}) -> handle. zero: the selection becomes 0; mean: the
-- reference batch's mean over its examples (over: ids or a cache); resample:
-- each example's selection from a random example of the reference batch.
-- name is a module output or a hook point; head and position pick one head
-- (q, k, v, scores, pattern, z, result) and one position.
function interventions.ablate(model, name, opts)
  local where = 'probe.ablate'
  opts = options.check(opts, {'kind', 'over', 'head', 'position', 'seed'}, where, 2)
  if opts.seed ~= nil and (type(opts.seed) ~= 'number' or opts.seed % 1 ~= 0) then error('probe.ablate: seed must be an integer', 2) end
  local kind = opts.kind or 'zero'
  if kind ~= 'zero' and kind ~= 'mean' and kind ~= 'resample' then
    error(("probe.ablate: kind must be 'zero', 'mean' or 'resample', got '%s'"):format(tostring(kind)), 2)
  end
  if kind ~= 'zero' and opts.over == nil then error(("probe.ablate: kind = '%s' needs over (the reference batch: ids or a cache)"):format(kind), 2) end
  local full, l = check_selection(model, name, opts, where)
  local ref = kind ~= 'zero' and reference(model, full, opts.over, where) or nil
  if kind == 'mean' and ref:size(1) < 2 then
    error(("probe.ablate: kind = 'mean' over a reference batch of one example would put that example's own activation "
      .. "back (the mean of one example is the example): pass over = ids of several examples (B > 1), or a cache of them"), 2)
  end
  local mean = kind == 'mean' and ref:mean(1, true) or nil
  -- resample's choices from its own sequence (seed), leaving the global generator alone
  local state = (opts.seed or 0) % 2147483648
  local function draw(n)
    state = (state * 1103515245 + 12345) % 2147483648
    return math.floor(state / 2147483648 * n) + 1
  end
  return replace_selection(model, name, l, opts, where, function(view, t, full)
    if kind == 'zero' then
      view:zero_()
    elseif kind == 'mean' then
      check_batch_shape(t, ref, full, where)
      view:copy_(selection(mean:expand(unpack(t:size())), l, full, opts, where))
    else
      check_batch_shape(t, ref, full, where)
      local picks = {}
      for b = 1, t:size(1) do picks[b] = draw(ref:size(1)) end
      local idx = torch.tensor(picks, {dtype = 'int64', device = ref.device})
      view:copy_(selection(ref:index_select(1, idx), l, full, opts, where))
    end
  end)
end

-- probe.set(model, name, value, {head, position}) -> handle: the selection
-- takes value (a number or a tensor that broadcasts to it).
function interventions.set(model, name, value, opts)
  local where = 'probe.set'
  opts = options.check(opts, {'head', 'position'}, where, 2)
  if type(value) ~= 'number' and not torch.is_tensor(value) then
    error(('probe.set: value must be a number or a Tensor, got %s'):format(type(value)), 2)
  end
  local _, l = check_selection(model, name, opts, where)
  return replace_selection(model, name, l, opts, where, function(view)
    if type(value) == 'number' then view:fill_(value) else view:copy_(value:expand(unpack(view:size()))) end
  end)
end

-- probe.patch(model, name, source, {head, position}) -> handle: the selection
-- comes from the same selection of source (a cache from another run, or a
-- tensor of the activation's shape): activation patching.
function interventions.patch(model, name, source, opts)
  local where = 'probe.patch'
  opts = options.check(opts, {'head', 'position'}, where, 2)
  local key, l = check_selection(model, name, opts, where)
  local src = source
  if type(source) == 'table' and getmetatable(source) == Cache then
    src = source[key]
    if src == nil then error(("probe.patch: the cache has no '%s' (run probe.run_with_cache with it in the filter)"):format(key), 2) end
  elseif not torch.is_tensor(source) then
    error(('probe.patch: source must be a cache or a Tensor, got %s'):format(type(source)), 2)
  end
  return replace_selection(model, name, l, opts, where, function(view, t, full)
    if format.shape(src) ~= format.shape(t) then
      error(("probe.patch: '%s' is %s here but %s in the source"):format(full, format.shape(t), format.shape(src)), 0)
    end
    view:copy_(selection(src, l, full, opts, where))
  end)
end

return interventions
