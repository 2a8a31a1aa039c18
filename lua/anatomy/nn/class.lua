-- nn.class(name, parent): a minimal class system. Calling the class makes an
-- instance and runs __init; instances are callable (m(x) runs the module) and
-- print through their class's __tostring.
local nn = require('anatomy.nn')

local function pass(...) return ... end

-- nn.class(name[, parent]) -> a class: Class(...) makes an instance and calls Class:__init(...);
-- methods are looked up in the class, then its parents
local function class(name, parent)
  local cls = {}
  cls.__typename = name
  cls.__index = cls
  -- Built-in blocks keep their parameters out of their fields (nn.Native):
  -- reading m.weight looks in _param_values first, in subclasses too.
  if parent and rawget(parent, '__params_first') then nn.params_first(cls) end
  -- Metamethods are looked up raw in the metatable, so each class forwards
  -- them to ordinary methods, which do inherit.
  -- Not a tail call: a module whose forward calls itself (return self(x))
  -- then fills the Lua stack and ends in "stack overflow", an error, instead
  -- of looping forever in compiled code that Ctrl-C cannot stop.
  cls.__call = function(self, ...) return pass(self:_call(...)) end
  cls.__tostring = function(self) return self:tostring() end
  cls.__newindex = function(self, key, value) self:_set_field(key, value) end
  setmetatable(cls, {
    __index = parent,
    __call = function(c, ...)
      local self = setmetatable({}, c)
      self:__init(...)
      return self
    end,
    __tostring = function() return name end,
  })
  return cls
end

-- Makes cls's instances read their registered parameters (_param_values)
-- before the class's methods, for parameters that are not stored as fields.
function nn.params_first(cls)
  rawset(cls, '__params_first', true)
  cls.__index = function(self, key)
    local values = rawget(self, '_param_values')
    local v = values and values[key]
    if v ~= nil then return v end
    return cls[key]
  end
end

-- True if v is an instance of cls or of a class derived from it.
local function is_instance(v, cls)
  if type(v) ~= 'table' then return false end
  local mt = getmetatable(v)
  while mt do
    if mt == cls then return true end
    local up = getmetatable(mt)
    mt = up and up.__index
  end
  return false
end

nn.class = class
nn.is_instance = is_instance
-- The class name of a value: 'nn.Linear', 'VibeNet', or Lua's type name.
function nn.typename(v)
  local mt = type(v) == 'table' and getmetatable(v)
  return mt and rawget(mt, '__typename') or type(v)
end

return class
