-- nn.Sequential{m1, m2, ...}: runs its children in order; children are
-- named 1, 2, ... Named children in order, as PyTorch's OrderedDict form:
-- nn.Sequential{{'embed', m1}, {'blocks', m2}}. An error names the block it
-- came from.
local nn = require('anatomy.nn')

local Sequential = nn.class('nn.Sequential', nn.Module)
nn.Sequential = Sequential

function Sequential:__init(list)
  nn.Module.__init(self)
  if list ~= nil and (type(list) ~= 'table' or nn.is_module(list)) then
    error(('nn.Sequential: expected a list of modules, got %s%s'):format(nn.typename(list),
      nn.is_module(list) and ' (write nn.Sequential{m1, m2, ...}, with braces)' or ''), 3)
  end
  local keyed = {}
  for k in pairs(list or {}) do
    if type(k) ~= 'number' or k % 1 ~= 0 or k < 1 or k > #list then keyed[#keyed + 1] = tostring(k) end
  end
  if #keyed > 0 then
    table.sort(keyed)
    error(("nn.Sequential: named entries (%s) have no order in a Lua table; give them in order as "
      .. "nn.Sequential{{'%s', module}, ...}, or use a list"):format(table.concat(keyed, ', '), keyed[1]), 3)
  end
  for i, m in ipairs(list or {}) do
    local name = tostring(i)
    if type(m) == 'table' and not getmetatable(m) and type(m[1]) == 'string' and m[3] == nil then
      name, m = m[1], m[2]
    end
    nn.check_forward(m, ('nn.Sequential: entry %d'):format(i), 3)
    self:add_module(name, m)
  end
end

-- seq:add(m): appends a child.
function Sequential:add(m)
  nn.check_forward(m, 'bad argument #1 to \'add\': the module', 2)
  return self:add_module(tostring(#self._children + 1), m)
end

-- seq:readout(h) -> logits from a hidden state of its stack (the logit
-- lens): the children after the one that holds the stack (seq:layers()),
-- applied to h. So a model written as nn.Sequential{embed, stack, head...}
-- gets the autopsy's lens without defining anything.
function Sequential:readout(h)
  local layers = self:layers()
  local holder = layers and layers[1] and layers[1][1]:match('^([^.]+)%.')
  local k
  for i, name in ipairs(self._children) do if name == holder then k = i end end
  if not k then
    error(('%s has no readout: its stack of layers is not one of its own children'):format(nn.typename(self)), 2)
  end
  for i = k + 1, #self._children do
    local name = self._children[i]
    h = nn.call_child(self, name, rawget(self, nn.child_key(name)), h)
  end
  return h
end

-- x through each child in order; an error names the child it came from
function Sequential:forward(x)
  for name, child in self:named_children() do x = nn.call_child(self, name, child, x) end
  return x
end

return Sequential
