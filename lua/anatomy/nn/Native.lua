-- The built-in blocks: Lua classes over C++ LibTorch modules (host/nn/).
-- Each holds its native block in self._native and exposes the block's
-- parameters as its own (the same tensors), so it follows nn.Module exactly.
local natives = require('anatomy.torch.native')
local nn = require('anatomy.nn')
local native = require('anatomy.torch.native').blocks
local Native = nn.class('nn.Native', nn.Module)
nn.Native = Native

-- Wraps a native block: registers its parameters under their own names.
-- They are not stored as fields: reading m.weight goes through the class's
-- __index (Native.define), so that assigning m.weight reaches _set_field,
-- which refuses it (the C++ block would go on using its own tensor).
function Native:_wrap(block)
  rawset(self, '_native', block)
  for _, pair in ipairs(block:named_parameters()) do
    table.insert(self._params, pair[1])
    self._param_values[pair[1]] = pair[2]
  end
end

function Native:_set_field(key, value)
  if type(key) == 'string' and (rawget(self, '_param_values') or {})[key] ~= nil then
    error(("%s.%s: the parameter of a built-in block cannot be replaced (its forward keeps using its own tensor); "
      .. "copy into it instead: torch.no_grad(function() m.%s:copy_(t) end), or m:load_state_dict{%s = t}")
      :format(nn.typename(self), key, key, key), 3)
  end
  return nn.Module._set_field(self, key, value)
end

-- m(x): the built-in block's forward in C++; through its hook points when a probe is on one
function Native:forward(x)
  local dispatch = rawget(self, '_hooks')
  if dispatch ~= nil then  -- hook probes: the block's points go through them (its explicit path)
    local y = self._native:forward(x, function(name, t) return dispatch(self, name, t) end, rawget(self, '_hooks_wanted'))
    return y
  end
  local y = self._native:forward(x)  -- not a tail call: errors keep the name 'forward'
  return y
end
-- m:set_cache(on): the built-in block's part in cached generation (model:kv_cache); a
-- block that keeps no cache (nn.VibeAttention) is an error
function Native:set_cache(on)
  if not self._native:takes_cache() then error(('%s keeps no key/value cache'):format(nn.typename(self)), 2) end
  self._native:set_cache(on)
end
-- m:takes_cache() -> whether the built-in block takes part in cached generation (from C++)
function Native:takes_cache() return self._native:takes_cache() end
-- m:set_mask(mask): the built-in block's padding mask, (B, T) bool, true at
-- real tokens (nil: none; model:set_padding); a block that reads none is an error
function Native:set_mask(mask)
  if not self._native:takes_mask() then error(('%s reads no padding mask'):format(nn.typename(self)), 2) end
  self._native:set_mask(mask)
end
-- m:takes_mask() -> whether the built-in block reads a padding mask (from C++)
function Native:takes_mask() return self._native:takes_mask() end
-- The block's settings as print(model) shows them (from C++)
function Native:extra_repr() return self._native:describe() end
function Native:_set_training(mode) self._native:train(mode) end

-- Checks an options table against the keys a constructor accepts.
function Native.options(opts, allowed, where) return require('anatomy.torch.options').check(opts, allowed, where, 4) end

-- Native.define(name, make) -> nn.<name>, a class whose __init(...) builds a
-- native block with make(...). Native.define(name, sizes, options[, extra])
-- is the common case: the block takes the named sizes, then an options table
-- whose keys must be among `options`; both go to anatomy.torch.native.blocks[name] as they
-- are (bindings/blocks.cpp maps the table onto the block's options struct).
-- extra.pattern: an attention block (keep_pattern, pattern); extra.declares:
-- its hook points (nn.point, nn/hook_point.lua), those the C++ block
-- publishes (host/nn/blocks.h); extra.role: what it is in a layer
-- ('attention', 'mlp', 'norm'), by which probes find a layer's children.
function Native.define(name, make, allowed, extra)
  local size_names = type(make) == 'table' and make or nil
  if type(make) ~= 'function' then
    local sizes = make
    make = function(...)
      local args = {...}
      local opts = Native.options(args[#sizes + 1], allowed, 'nn.' .. name)
      local n = select('#', ...)
      if n > #sizes + 1 then
        error(('nn.%s: expected %d size%s and an options table, got %d arguments'):format(name, #sizes, #sizes == 1 and '' or 's', n), 4)
      end
      args[#sizes + 1] = opts
      local block = natives.blocks[name](unpack(args, 1, #sizes + 1))
      return block
    end
  end
  local cls = nn.class('nn.' .. name, Native)
  nn.params_first(cls)  -- m.weight: the registered parameter, then the class's methods
  function cls:__init(...)
    nn.Module.__init(self)
    self:_wrap(make(...))
    if size_names then  -- the sizes and options it was made with (num_heads reads them)
      local args, opts = {...}, select(#size_names + 1, ...)
      local made = {}
      if type(opts) == 'table' then for k, v in pairs(opts) do made[k] = v end end
      for i, n in ipairs(size_names) do made[n] = args[i] end
      rawset(self, '_made_with', made)
    end
  end
  nn[name] = cls
  cls.declares = extra and extra.declares
  cls.block_role = extra and extra.role
  if extra and extra.pattern then
    for k, f in pairs(Native.pattern_methods) do cls[k] = f end
    local fixed = extra.heads
    -- m:num_heads(point) -> the heads of the tensor at hook point `point`
    -- (k and v have kv_heads of them where keys and values are shared)
    function cls:num_heads(point)
      if fixed then return fixed end
      local made = rawget(self, '_made_with') or {}
      if (point == 'k' or point == 'v' or point == 'rot_k' or point == 'k_normed') and made.kv_heads then return made.kv_heads end
      return made.heads
    end
  end
  return cls
end

-- Attention blocks publish their attention matrix (B, H, T, T) when asked:
-- m:keep_pattern(true[, grad]) keeps the last one, m:pattern() returns it.
-- define copies them onto attention blocks only (probes look for keep_pattern to find attention).
Native.pattern_methods = {
  -- m:keep_pattern(keep[, grad]): keep (or stop keeping) the attention pattern of each forward; grad keeps it in the graph
  keep_pattern = function(self, keep, grad) self._native:keep_pattern(keep, grad) end,
  -- m:pattern() -> the last attention pattern kept (B, H, T, T), or nil
  pattern = function(self)
    local p = self._native:pattern()
    return p
  end,
}

return Native
