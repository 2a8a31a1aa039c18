-- json: encodes Lua values as JSON (reports, metrics). Arrays are tables
-- with keys 1..n; other tables are objects with sorted keys; NaN and
-- infinities become null, as JSON has no words for them.
local json = {}

local escapes = {['"'] = '\\"', ['\\'] = '\\\\', ['\b'] = '\\b', ['\f'] = '\\f', ['\n'] = '\\n', ['\r'] = '\\r', ['\t'] = '\\t'}

local function encode_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c) return escapes[c] or ('\\u%04x'):format(c:byte()) end) .. '"'
end

local function is_array(t)
  local n = #t
  for k in pairs(t) do
    if type(k) ~= 'number' or k < 1 or k > n or k % 1 ~= 0 then return false end
  end
  return true
end

local function encode(v, seen)
  local t = type(v)
  if v == nil then return 'null' end
  if t == 'boolean' then return tostring(v) end
  if t == 'number' then
    if v ~= v or v == math.huge or v == -math.huge then return 'null' end
    if v % 1 == 0 and math.abs(v) < 2 ^ 53 then return ('%d'):format(v) end
    return ('%.10g'):format(v)
  end
  if t == 'string' then return encode_string(v) end
  if torch and torch.is_tensor(v) then return encode(v:dim() == 0 and v:item() or v:tolist(), seen) end
  if t ~= 'table' then error(('json: cannot encode a %s'):format(t), 0) end
  if seen[v] then error('json: cannot encode a table that contains itself', 0) end
  seen[v] = true
  local out = {}
  if is_array(v) then
    for i = 1, #v do out[i] = encode(v[i], seen) end
    seen[v] = nil
    return '[' .. table.concat(out, ',') .. ']'
  end
  local keys = {}
  for k in pairs(v) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  for _, k in ipairs(keys) do out[#out + 1] = encode_string(tostring(k)) .. ':' .. encode(v[k], seen) end
  seen[v] = nil
  return '{' .. table.concat(out, ',') .. '}'
end

-- json.encode(value) -> string
function json.encode(value) return encode(value, {}) end

return json
