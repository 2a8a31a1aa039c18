-- incremental: what a model must offer for cached generation and padded
-- batches, the state a forward reads beside its input (docs/model.md,
-- "Cached generation", "Padded batches"): whether every attention takes
-- part (m:kv_cacheable, m:paddable), and switching it on for all of them
-- (m:kv_cache, m:set_padding). nn.Module's methods, kept apart from the base
-- protocol.
local torch = require('anatomy.torch')
local nn = require('anatomy.nn')
local Module = nn.Module

-- Whether every attention in the model (a module publishing a 'pattern'
-- hook point, or with keep_pattern) has `method` (set_cache, set_mask) and,
-- built in, takes part (`takes`): true, or false and why not.
local function attentions_take(model, method, takes, what)
  if not model.incremental then
    return false, ('%s does not declare that its positions come from its blocks (its class sets incremental = true when '
      .. 'its forward can take the new tokens alone, or a padded batch)'):format(nn.typename(model))
  end
  for name, m in model:named_modules() do
    local attention = type(m.keep_pattern) == 'function'
    for _, p in ipairs(m:hook_points()) do attention = attention or p == 'pattern' end
    if attention then
      if type(m[method]) ~= 'function' then return false, ('%s (%s) is an attention without %s'):format(nn.typename(m), name, method) end
      if m[takes] and not m[takes](m) then return false, ('%s (%s) %s'):format(nn.typename(m), name, what) end
    end
  end
  return true
end

-- m:kv_cacheable() -> true, or false and why not: whether generation can
-- feed the model only its new tokens under a key/value cache. The model's
-- class declares that its forward reads positions only through blocks that
-- take part (Class.incremental = true: models.gpt, GPT-2, Llama, GPT-NeoX),
-- and every attention in it (a module publishing a 'pattern' hook point or
-- with keep_pattern) takes part: a built-in one that keeps a cache, or a Lua
-- block with set_cache(on) (docs/model.md, "Cached generation").
function Module:kv_cacheable()
  local ok, why = attentions_take(self, 'set_cache', 'takes_cache', 'keeps no key/value cache')
  return ok, why
end

-- m:paddable() -> true, or false and why not: whether the model takes a
-- padded batch (model:set_padding): as kv_cacheable, with set_mask(mask) on
-- every attention (docs/model.md, "Padded batches").
function Module:paddable()
  local ok, why = attentions_take(self, 'set_mask', 'takes_mask', 'reads no padding mask')
  return ok, why
end

-- m:set_padding(mask): every block of the model that reads a padding mask
-- takes mask (B, T) bool, true at real tokens (nil: none): attention then
-- attends to no padded key and positions count real tokens only.
-- probe.forward(model, ids, mask) sets it around one forward.
function Module:set_padding(mask)
  if mask ~= nil and not (torch.is_tensor(mask) and mask:dim() == 2 and (mask.dtype == 'bool' or mask.dtype == 'int64')) then
    error(('set_padding: mask must be (B, T) bool or int64, or nil, got %s'):format(torch.is_tensor(mask) and
      (mask.dtype .. ' ' .. table.concat(mask:size(), 'x')) or type(mask)), 2)
  end
  if mask ~= nil and mask.dtype ~= 'bool' then mask = mask:ne(0) end
  for _, m in self:named_modules() do
    if type(m.set_mask) == 'function' and (not m.takes_mask or m:takes_mask()) then m:set_mask(mask) end
  end
end

-- m:kv_cache(on): every block of the model that takes part in cached
-- generation starts (true) or drops (false) its cache; while on, the model
-- reads each input as the positions after those it has seen.
function Module:kv_cache(on)
  for _, m in self:named_modules() do
    if type(m.set_cache) == 'function' and (not m.takes_cache or m:takes_cache()) then m:set_cache(on and true or false) end
  end
end
