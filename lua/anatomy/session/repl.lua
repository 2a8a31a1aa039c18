-- What the REPL shows and completes. The host reads lines and runs them;
-- this file decides how results print and which words complete.
local torch = require('anatomy.torch')
local repl = {}

local keywords = {
  'and', 'break', 'do', 'else', 'elseif', 'end', 'false', 'for', 'function', 'goto', 'if', 'in',
  'local', 'nil', 'not', 'or', 'repeat', 'return', 'then', 'true', 'until', 'while',
}

local function is_identifier(s) return type(s) == 'string' and s:match('^[%a_][%w_]*$') ~= nil end

-- A readable, bounded rendering of any value (tables nest up to `depth`).
local function render(value, depth, indent, seen)
  local t = type(value)
  if t == 'string' then return string.format('%q', value) end
  if t ~= 'table' then return tostring(value) end
  if seen[value] then return '<cycle>' end
  local mt = getmetatable(value)
  if mt and mt.__tostring then return tostring(value) end
  if depth <= 0 then return tostring(value) end
  seen[value] = true
  local keys, n = {}, #value
  for k in pairs(value) do
    if not (type(k) == 'number' and k >= 1 and k <= n and k % 1 == 0) then keys[#keys + 1] = k end
  end
  table.sort(keys, function(a, b)
    if type(a) == type(b) and (type(a) == 'string' or type(a) == 'number') then return a < b end
    return type(a) < type(b)
  end)
  local parts, long = {}, false
  for i = 1, n do parts[#parts + 1] = render(value[i], depth - 1, indent .. '  ', seen) end
  for _, k in ipairs(keys) do
    local name = is_identifier(k) and k or '[' .. render(k, 0, '', seen) .. ']'
    parts[#parts + 1] = name .. ' = ' .. render(value[k], depth - 1, indent .. '  ', seen)
  end
  seen[value] = nil
  local total = 0
  for _, p in ipairs(parts) do
    total = total + #p
    if p:find('\n') then long = true end
  end
  if #parts == 0 then return '{}' end
  if not long and total + 2 * #parts < 72 then return '{' .. table.concat(parts, ', ') .. '}' end
  return '{\n' .. indent .. '  ' .. table.concat(parts, ',\n' .. indent .. '  ') .. '\n' .. indent .. '}'
end
repl.render = function(value) return render(value, 3, '', {}) end

-- Prints each result of a command; the first is kept in the global `_`.
function repl.show(...)
  local n = select('#', ...)
  if n == 0 then return end
  _G._ = (...)
  for i = 1, n do print(repl.render((select(i, ...)))) end
end

-- Keys reachable from a value: its own fields and those of its __index chain.
local function fields(value, out, depth)
  if depth > 4 then return end
  if type(value) == 'table' then
    for k in pairs(value) do if type(k) == 'string' then out[k] = true end end
  end
  local mt = (type(value) == 'table' or type(value) == 'userdata') and debug.getmetatable(value)
  if mt and type(mt.__index) == 'table' then fields(mt.__index, out, depth + 1) end
  if torch and torch.is_tensor(value) then
    for k in pairs(torch.Tensor) do out[k] = true end
    for _, k in ipairs{'shape', 'grad', 'requires_grad', 'dtype', 'device', 'is_leaf', 'grad_fn', 'ndim', 'T'} do out[k] = true end
  end
end

-- Completions of `text` ("tor", "torch.ze", "x:me"): full replacement words.
function repl.complete(text)
  local prefix, sep, partial = text:match('^(.*)([%.:])([%w_]*)$')
  local candidates, base = {}, nil
  if prefix then
    base = _G
    for part in prefix:gmatch('[^%.:]+') do
      if not is_identifier(part) then return {} end
      local ok, v = pcall(function() return base[part] end)
      if not ok or v == nil then return {} end
      base = v
    end
    fields(base, candidates, 0)
  else
    prefix, sep, partial = '', '', text
    fields(_G, candidates, 0)
    for _, k in ipairs(keywords) do candidates[k] = true end
  end
  local out = {}
  for k in pairs(candidates) do
    if k:sub(1, #partial) == partial and is_identifier(k) then
      local method_ok = sep ~= ':' or type(base[k]) == 'function'
      if method_ok then out[#out + 1] = prefix .. sep .. k end
    end
  end
  table.sort(out)
  return out
end

return repl
