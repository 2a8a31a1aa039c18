-- config: a script's flat config table, overridden by --key=value arguments
-- (nanoGPT's configurator): numbers and booleans are converted to the type
-- of the default; an unknown key is an error that lists the known ones.
local config = {}

-- config.parse(defaults, args, usage) -> a new table: defaults with the overrides applied.
-- --help prints usage and the defaults; then, when args is the script's own
-- command line (the global arg), the script exits; any other table (a call
-- from the REPL, say) gets the defaults back and the session goes on.
function config.parse(defaults, args, usage)
  local out = {}
  for k, v in pairs(defaults) do out[k] = v end
  for _, a in ipairs(args or {}) do
    if a == '--help' or a == '-h' then
      print(usage or 'options (--key=value):')
      local keys = {}
      for k in pairs(defaults) do keys[#keys + 1] = k end
      table.sort(keys)
      for _, k in ipairs(keys) do print(('  --%s=%s'):format(k, tostring(defaults[k]))) end
      if rawequal(args, rawget(_G, 'arg')) then os.exit(0) end
      return out
    end
    local key, value = a:match('^%-%-([%w_]+)=(.*)$')
    if not key then error(("bad argument '%s' (expected --key=value)"):format(a), 0) end
    local default = defaults[key]
    if default == nil then
      local keys = {}
      for k in pairs(defaults) do keys[#keys + 1] = k end
      table.sort(keys)
      error(("unknown option --%s%s (known: %s)"):format(key, require('anatomy.torch.options').did_you_mean(key, keys),
        table.concat(keys, ', ')), 0)
    end
    if type(default) == 'number' then
      local n = tonumber(value)
      if not n then error(("--%s expects a number, got '%s'"):format(key, value), 0) end
      out[key] = n
    elseif type(default) == 'boolean' then
      if value ~= 'true' and value ~= 'false' then error(("--%s expects true or false, got '%s'"):format(key, value), 0) end
      out[key] = value == 'true'
    else
      out[key] = value
    end
  end
  return out
end

return config
