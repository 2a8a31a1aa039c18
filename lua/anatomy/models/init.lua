-- models: the architectures anatomy dissects, written in Lua from nn blocks.
local models = {}
package.loaded['anatomy.models'] = models

require 'anatomy.models.vibenet'
require 'anatomy.models.gpt'
require 'anatomy.models.funnel'
require 'anatomy.models.stateful'

-- Checks a config table: required keys present, no unknown keys.
function models.check_config(name, cfg, required, optional)
  if type(cfg) ~= 'table' then error(('models.%s: expected a config table, got %s'):format(name, type(cfg)), 3) end
  local known = {}
  for _, k in ipairs(required) do
    known[k] = true
    if cfg[k] == nil then error(('models.%s: config needs %s'):format(name, k), 3) end
  end
  for _, k in ipairs(optional) do known[k] = true end
  for k in pairs(cfg) do
    if not known[k] then
      local names = {}
      for n in pairs(known) do names[#names + 1] = n end
      table.sort(names)
      error(('models.%s: unknown config key \'%s\' (expected %s)'):format(name, tostring(k), table.concat(names, ', ')), 3)
    end
  end
end

return models
