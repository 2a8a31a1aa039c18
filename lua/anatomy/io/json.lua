-- json: encodes Lua values as JSON (reports, metrics) and decodes JSON text.
-- Arrays are tables with keys 1..n; other tables are objects with sorted
-- keys; NaN and infinities become null, as JSON has no words for them.
-- Decoding turns null into json.null (a Lua nil cannot sit in an array).
local torch = require('anatomy.torch')
local json = {}

local escapes = {['"'] = '\\"', ['\\'] = '\\\\', ['\b'] = '\\b', ['\f'] = '\\f', ['\n'] = '\\n', ['\r'] = '\\r', ['\t'] = '\\t'}

local function encode_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c) return escapes[c] or ('\\u%04x'):format(c:byte()) end) .. '"'
end

-- json.object(t) -> t, marked to encode as an object even when empty ({}
-- would otherwise be the empty array)
local object_mt = {}
function json.object(t) return setmetatable(t or {}, object_mt) end

local function is_array(t)
  local n = #t
  for k in pairs(t) do
    if type(k) ~= 'number' or k < 1 or k > n or k % 1 ~= 0 then return false end
  end
  return true
end

-- json.number(v) -> the shortest decimal that reads back as the same number
-- (integers without a point); JSON and CSV write numbers this way
function json.number(v)
  if v % 1 == 0 and math.abs(v) < 2 ^ 53 then return ('%d'):format(v) end
  for digits = 15, 16 do
    local text = ('%.' .. digits .. 'g'):format(v)
    if tonumber(text) == v then return text end
  end
  return ('%.17g'):format(v)
end

local function encode(v, seen)
  local t = type(v)
  if v == nil or v == json.null then return 'null' end
  if t == 'boolean' then return tostring(v) end
  if t == 'number' then
    if v ~= v or v == math.huge or v == -math.huge then return 'null' end
    if v % 1 == 0 and math.abs(v) < 2 ^ 53 then return ('%d'):format(v) end
    return json.number(v)
  end
  if t == 'string' then return encode_string(v) end
  if torch and torch.is_tensor(v) then return encode(v:dim() == 0 and v:item() or v:tolist(), seen) end
  if t ~= 'table' then error(('json: cannot encode a %s'):format(t), 0) end
  if seen[v] then error('json: cannot encode a table that contains itself', 0) end
  seen[v] = true
  local out = {}
  if getmetatable(v) ~= object_mt and is_array(v) then
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

-- The value decoded from JSON's null.
json.null = setmetatable({}, {__tostring = function() return 'json.null' end})

local unescapes = {['"'] = '"', ['\\'] = '\\', ['/'] = '/', b = '\b', f = '\f', n = '\n', r = '\r', t = '\t'}

local function utf8_char(cp)
  if cp < 0x80 then return string.char(cp) end
  if cp < 0x800 then return string.char(0xc0 + math.floor(cp / 0x40), 0x80 + cp % 0x40) end
  if cp < 0x10000 then
    return string.char(0xe0 + math.floor(cp / 0x1000), 0x80 + math.floor(cp / 0x40) % 0x40, 0x80 + cp % 0x40)
  end
  return string.char(0xf0 + math.floor(cp / 0x40000), 0x80 + math.floor(cp / 0x1000) % 0x40,
    0x80 + math.floor(cp / 0x40) % 0x40, 0x80 + cp % 0x40)
end

-- json.decode(text) -> value; a malformed text is an error that names the
-- byte offset and what was expected there.
function json.decode(text)
  if type(text) ~= 'string' then error(("bad argument #1 to 'decode' (string expected, got %s)"):format(type(text)), 2) end
  local pos = 1
  local function fail(what) error(('json.decode: %s at byte %d'):format(what, pos), 0) end
  local function skip() pos = text:find('[^ \t\r\n]', pos) or #text + 1 end
  local value
  local function str()
    local out = {}
    pos = pos + 1
    while true do
      local c = text:sub(pos, pos)
      if c == '' then fail('unterminated string') end
      if c == '"' then pos = pos + 1 break end
      if c == '\\' then
        local e = text:sub(pos + 1, pos + 1)
        if e == 'u' then
          local hex = text:sub(pos + 2, pos + 5)
          if not hex:match('^%x%x%x%x$') then fail('bad \\u escape') end
          local cp = tonumber(hex, 16)
          pos = pos + 6
          if cp >= 0xd800 and cp <= 0xdbff and text:sub(pos, pos + 1) == '\\u' then  -- a surrogate pair
            local low = tonumber(text:sub(pos + 2, pos + 5), 16)
            if low and low >= 0xdc00 and low <= 0xdfff then
              cp = 0x10000 + (cp - 0xd800) * 0x400 + (low - 0xdc00)
              pos = pos + 6
            end
          end
          out[#out + 1] = utf8_char(cp)
        elseif unescapes[e] then
          out[#out + 1] = unescapes[e]
          pos = pos + 2
        else
          fail('bad escape')
        end
      elseif c:byte() < 32 then
        fail('control character in a string')
      else
        -- the next quote, backslash or control character (below 32: DEL, which
        -- %c also matches, is an ordinary character in JSON)
        local j = text:find('["\\%z\1-\31]', pos) or #text + 1
        out[#out + 1] = text:sub(pos, j - 1)
        pos = j
      end
    end
    return table.concat(out)
  end
  -- Past a container's opening bracket: true (and past `close`) when it is empty.
  local function opened(close)
    pos = pos + 1
    skip()
    if text:sub(pos, pos) == close then pos = pos + 1 return true end
    return false
  end
  -- After an element: ',' means another follows, `close` ends the container.
  local function after_item(close)
    skip()
    local d = text:sub(pos, pos)
    if d == close then pos = pos + 1 return true end
    if d ~= ',' then fail(("expected ',' or '%s'"):format(close)) end
    pos = pos + 1
    return false
  end
  function value(depth)
    if depth > 200 then fail('nesting deeper than 200') end
    skip()
    local c = text:sub(pos, pos)
    if c == '{' then
      local obj = {}
      if opened('}') then return obj end
      repeat
        skip()
        if text:sub(pos, pos) ~= '"' then fail('expected a string key') end
        local k = str()
        skip()
        if text:sub(pos, pos) ~= ':' then fail("expected ':'") end
        pos = pos + 1
        obj[k] = value(depth + 1)
      until after_item('}')
      return obj
    elseif c == '[' then
      local arr = {}
      if opened(']') then return arr end
      repeat arr[#arr + 1] = value(depth + 1) until after_item(']')
      return arr
    elseif c == '"' then
      return str()
    elseif text:sub(pos, pos + 3) == 'true' then pos = pos + 4 return true
    elseif text:sub(pos, pos + 4) == 'false' then pos = pos + 5 return false
    elseif text:sub(pos, pos + 3) == 'null' then pos = pos + 4 return json.null
    end
    local num = text:match('^-?%d+%.?%d*[eE]?[-+]?%d*', pos)
    if num and num ~= '' and num ~= '-' then
      local n = tonumber(num)
      if not n then fail('bad number') end
      pos = pos + #num
      return n
    end
    fail(c == '' and 'unexpected end of text' or ("unexpected '%s'"):format(c))
  end
  local v = value(0)
  skip()
  if pos <= #text then fail('trailing characters') end
  return v
end

return json
