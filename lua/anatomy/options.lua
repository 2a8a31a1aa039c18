-- options: checks an options table against the keys a function accepts, so
-- that a misspelt option is an error that lists the right ones.
local options = {}

-- options.check(opts, allowed, where, level) -> opts (or {} for nil)
-- allowed: a list of names, or a set {name = true}; level: error()'s level.
function options.check(opts, allowed, where, level)
  level = (level or 2) + 1
  if opts == nil then return {} end
  if type(opts) ~= 'table' then error(('%s: options must be a table, got %s'):format(where, type(opts)), level) end
  local set = allowed
  if allowed[1] then
    set = {}
    for _, k in ipairs(allowed) do set[k] = true end
  end
  for k in pairs(opts) do
    if not set[k] then
      local names = {}
      for n in pairs(set) do
        if not tostring(n):match('^_') then names[#names + 1] = n end  -- _names are internal (tests)
      end
      table.sort(names)
      error(("%s: unknown option '%s' (expected %s)"):format(where, tostring(k), table.concat(names, ', ')), level)
    end
  end
  return opts
end

return options
