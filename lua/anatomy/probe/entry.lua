-- A hook entry, the one thing that attaches to a module (probe/hooks.lua):
-- made and checked here, so that a misspelt or mistyped field is an error
-- naming it where the entry is made, not a probe that silently does nothing.
local entry = {}

-- Every field an entry may have: its type, and what it is for.
local fields = {
  kind = {'string', "what it does: 'capture', 'replace', 'skip' or 'idle'"},
  hook = {'boolean', "true: it acts on the block's hook points, not its output"},
  path = {'string', "the module's path in its model ('' for the model)"},
  name = {'string', 'the name it records or replaces under (a module output)'},
  label = {'string', 'where it acts, as probe.list shows it'},
  match = {'function', 'match(full) -> whether it acts on the hook point named full'},
  fn = {'function', 'a replacement: fn(t, name[, input]) -> the tensor to use, or nil'},
  record = {'function', 'a capture: record(name, t[, module])'},
  wants_asked = {'function', "wants_asked(full) -> whether a point of cost 'asked' is computed for it"},
  pattern = {'boolean', "true: keeps the module's attention pattern while attached"},
  grad = {'boolean', 'true: the kept pattern stays in the graph'},
  publishes = {'table', "names of further hook points it publishes, relative to the module ('resid_post.sae.acts')"},
  sae = {'table', 'the SAE it splices in'},
  scoped = {'boolean', 'true: attached for a probe.with or run_with_hooks that removes it'},
}
local kinds = {capture = true, replace = true, skip = true, idle = true}
local names = {}
for k in pairs(fields) do names[#names + 1] = k end
table.sort(names)

local Entry = {}

-- The check of one field, raised at `level`.
local function check(key, value, level)
  local spec = fields[key]
  if not spec then
    error(("probe entry: unknown field '%s' (fields: %s)"):format(tostring(key), table.concat(names, ', ')), level + 1)
  end
  if value ~= nil and type(value) ~= spec[1] then
    error(("probe entry: field '%s' must be a %s (%s), got %s"):format(key, spec[1], spec[2], type(value)), level + 1)
  end
  if key == 'kind' and not kinds[value] then
    error(("probe entry: field 'kind' must be 'capture', 'replace', 'skip' or 'idle', got %s"):format(tostring(value)), level + 1)
  end
  if key == 'publishes' and value then
    for i, p in ipairs(value) do
      if type(p) ~= 'string' then error(("probe entry: field 'publishes'[%d] must be a string, got %s"):format(i, type(p)), level + 1) end
    end
  end
end

-- A field set after the entry is made (an SAE's publishes, probe.with's scoped) is checked too.
Entry.__newindex = function(self, key, value)
  check(key, value, 2)
  rawset(self, key, value)
end

-- entry.new(t) -> t as an entry: each field checked (the table above), kind
-- required, and what its kind needs (a replacement's fn, a capture's record)
-- present; an error at `level` names the field
function entry.new(t, level)
  level = (level or 1) + 1
  if type(t) ~= 'table' then error(('probe entry: expected a table, got %s'):format(type(t)), level) end
  if getmetatable(t) == Entry then return t end
  for k, v in pairs(t) do check(k, v, level) end
  if t.kind == nil then error("probe entry: field 'kind' is missing ('capture', 'replace', 'skip' or 'idle')", level) end
  if t.kind == 'replace' and not t.fn then error("probe entry: a 'replace' entry needs field 'fn'", level) end
  if t.kind == 'capture' and not t.record then error("probe entry: a 'capture' entry needs field 'record'", level) end
  if t.hook and not t.match then error("probe entry: a hook entry (hook = true) needs field 'match'", level) end
  return setmetatable(t, Entry)
end

-- entry.is(v) -> whether v was made by entry.new
function entry.is(v) return getmetatable(v) == Entry end

return entry
