-- The built-in blocks: Lua classes over C++ LibTorch modules (host/nn/).
-- Each holds its native block in self._native and exposes the block's
-- parameters as its own (the same tensors), so it follows nn.Module exactly.
local nn = require 'anatomy.nn'
local native = torch._native

local Native = nn.class('nn.Native', nn.Module)
nn.Native = Native

-- Wraps a native block: registers its parameters under their own names.
function Native:_wrap(block)
  rawset(self, '_native', block)
  for _, pair in ipairs(block:named_parameters()) do self:register_parameter(pair[1], pair[2]) end
end

function Native:forward(x)
  local y = self._native:forward(x)  -- not a tail call: errors keep the name 'forward'
  return y
end
function Native:extra_repr() return self._native:describe() end
function Native:_set_training(mode) self._native:train(mode) end

-- Checks an options table against the keys a constructor accepts.
local function options(opts, allowed, where) return require('anatomy.options').check(opts, allowed, where, 3) end

-- Defines nn.<name> whose __init(...) builds a native block with make(...).
local function define(name, make)
  local cls = nn.class('nn.' .. name, Native)
  function cls:__init(...)
    nn.Module.__init(self)
    self:_wrap(make(...))
  end
  nn[name] = cls
  return cls
end

-- nn.Linear(in, out, {bias = true})
define('Linear', function(i, o, opts)
  opts = options(opts, {bias = true, name = true}, 'nn.Linear')
  return native.Linear(i, o, opts.bias ~= false)
end)

-- nn.Embedding(n, dim, {positions = T}): 1-based int64 ids; a learned position table if positions is given
define('Embedding', function(n, dim, opts)
  opts = options(opts, {positions = true}, 'nn.Embedding')
  return native.Embedding(n, dim, opts.positions)
end)

-- nn.LayerNorm(dim, {eps = 1e-5})
define('LayerNorm', function(dim, opts)
  opts = options(opts, {eps = true}, 'nn.LayerNorm')
  return native.LayerNorm(dim, opts.eps or 1e-5)
end)

-- nn.RMSNorm(dim, {eps = 1e-6}): learnable weight
define('RMSNorm', function(dim, opts)
  opts = options(opts, {eps = true}, 'nn.RMSNorm')
  return native.RMSNorm(dim, opts.eps or 1e-6)
end)

-- nn.GELU({approximate = 'none'|'tanh'})
define('GELU', function(opts)
  opts = options(opts, {approximate = true}, 'nn.GELU')
  local a = opts.approximate or 'none'
  if a ~= 'none' and a ~= 'tanh' then error(("nn.GELU: approximate must be 'none' or 'tanh', got '%s'"):format(tostring(a)), 3) end
  return native.Activation(a == 'tanh' and 'gelu_tanh' or 'gelu')
end)

-- nn.ReLU()
define('ReLU', function() return native.Activation('relu') end)

-- nn.Dropout(p)
define('Dropout', function(p) return native.Dropout(p or 0.5) end)

-- nn.Attention(dim, heads, {causal = true, bias = true}): children qkv and proj
define('Attention', function(dim, heads, opts)
  opts = options(opts, {causal = true, bias = true}, 'nn.Attention')
  return native.Attention(dim, heads, opts.causal ~= false, opts.bias ~= false)
end)

-- nn.VibeAttention({causal = true}): softmax(mask(x xᵀ / √d)) x, no parameters
define('VibeAttention', function(opts)
  opts = options(opts, {causal = true}, 'nn.VibeAttention')
  return native.VibeAttention(opts.causal ~= false)
end)

-- nn.MLP(dim, hidden, {activation = 'gelu'|'gelu_tanh'|'relu', bias = true}): children fc and proj
define('MLP', function(dim, hidden, opts)
  opts = options(opts, {activation = true, bias = true}, 'nn.MLP')
  return native.MLP(dim, hidden, opts.activation or 'gelu', opts.bias ~= false)
end)

-- Attention blocks publish their attention matrix (B, H, T, T) when asked:
-- m:keep_pattern(true[, grad]) keeps the last one, m:pattern() returns it.
for _, name in ipairs{'Attention', 'VibeAttention'} do
  nn[name].keep_pattern = function(self, keep, grad) self._native:keep_pattern(keep, grad) end
  nn[name].pattern = function(self) return self._native:pattern() end
end

return Native
