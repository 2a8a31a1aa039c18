-- yaml: YAML documents as Lua values, parsed in C++ by yaml-cpp (host/io/yaml.h),
-- for SAELens's release registry (pretrained_saes.yaml) and other YAML a
-- library writes. Maps become tables, sequences arrays from 1, and plain
-- scalars what YAML 1.2's core schema says: true/false, numbers (0o and 0x
-- integers, .inf, .nan), null as yaml.null (the sentinel json.null is, so a
-- key whose value is null stays present); everything else, and anything
-- quoted, a string. A node an alias names is one table reached twice.
local native = require('anatomy.torch.native')
local json = require('anatomy.io.json')
local yaml = {}

yaml.null = json.null

-- yaml.decode(text[, name]) -> the document's value (nil text is an error). An error names `name`
-- (default '<string>'), the line and the column; refused: a second document, nesting past 256
-- levels, a duplicate or non-scalar key, an alias to a node that contains it, tags not YAML's own,
-- integers past 2^53
function yaml.decode(text, name)
  if type(text) ~= 'string' then error(("yaml.decode: text must be a string, got a %s"):format(type(text)), 2) end
  if name ~= nil and type(name) ~= 'string' then error(("yaml.decode: name must be a string, got a %s"):format(type(name)), 2) end
  local v = native.yaml_decode(text, name or '<string>', yaml.null, 'yaml.decode')
  return v  -- not a tail call: an error's position is the caller's line
end

-- yaml.read(path) -> the value of the YAML file at path, as yaml.decode; errors name the path
function yaml.read(path)
  if type(path) ~= 'string' then error(("yaml.read: path must be a string, got a %s"):format(type(path)), 2) end
  local why = native.not_a_file(path)
  if why then error(("yaml.read: cannot read '%s': it %s"):format(path, why), 2) end
  local f, err = io.open(path, 'rb')
  if not f then error(("yaml.read: cannot read '%s' (%s)"):format(path, err), 2) end
  local text = f:read('*a')
  f:close()
  local v = native.yaml_decode(text, "'" .. path .. "'", yaml.null, 'yaml.read')
  return v
end

return yaml
