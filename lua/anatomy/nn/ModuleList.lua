-- nn.ModuleList{m1, m2, ...}: modules held in a list so that their
-- parameters register (as PyTorch's ModuleList); children are named 1, 2, ...
-- and are list[i]. It has no forward: the block that holds it decides how
-- to run them. nn.ModuleDict{name = m, ...}: the same by name (sorted).
local nn = require('anatomy.nn')

local ModuleList = nn.class('nn.ModuleList', nn.Module)
nn.ModuleList = ModuleList
rawset(ModuleList, '__no_forward', true)

function ModuleList:__init(list)
  nn.Module.__init(self)
  if list ~= nil and type(list) ~= 'table' then error(('nn.ModuleList: expected a list of modules, got %s'):format(nn.typename(list)), 3) end
  for i, m in ipairs(list or {}) do
    if not nn.is_module(m) then error(('nn.ModuleList: entry %d is %s, not a module'):format(i, nn.typename(m)), 3) end
    self:add_module(tostring(i), m)
  end
end

-- list:append(m) -> m
function ModuleList:append(m)
  if not nn.is_module(m) then error(('bad argument #1 to \'append\' (module expected, got %s)'):format(nn.typename(m)), 2) end
  return self:add_module(tostring(#self._children + 1), m)
end

-- A ModuleList holds modules; it has no forward of its own (an error says so)
function ModuleList:forward()
  error('nn.ModuleList has no forward: iterate over it (for i, m in ipairs(list:children()) ...) in the forward of the block that holds it', 2)
end

local ModuleDict = nn.class('nn.ModuleDict', nn.Module)
nn.ModuleDict = ModuleDict
rawset(ModuleDict, '__no_forward', true)

function ModuleDict:__init(dict)
  nn.Module.__init(self)
  if dict ~= nil and type(dict) ~= 'table' then error(('nn.ModuleDict: expected a table of modules, got %s'):format(nn.typename(dict)), 3) end
  local keys = {}
  for k in pairs(dict or {}) do
    if type(k) ~= 'string' then error(('nn.ModuleDict: keys must be names (strings), got %s'):format(type(k)), 3) end
    keys[#keys + 1] = k
  end
  table.sort(keys)
  for _, k in ipairs(keys) do
    if not nn.is_module(dict[k]) then error(("nn.ModuleDict: entry '%s' is %s, not a module"):format(k, nn.typename(dict[k])), 3) end
    self:add_module(k, dict[k])
  end
end

-- A ModuleDict holds modules; it has no forward of its own (an error says so)
function ModuleDict:forward()
  error('nn.ModuleDict has no forward: call its entries (dict.name(x)) in the forward of the block that holds it', 2)
end

return ModuleList
