-- export: numbers out to the tools people already use. CSV (a spreadsheet,
-- pandas.read_csv) and TensorBoard event files (tensorboard --logdir),
-- written atomically. train.export_metrics and the autopsy's a:csv() and
-- a:tensorboard() build on these.
local fs = require('anatomy.io.fs')
local ffi = require('ffi')
local bit = require('bit')
local json = require('anatomy.io.json')

local export = {}

-- ---- CSV (RFC 4180) -----------------------------------------------------------

local function csv_cell(v)
  if v == nil then return '' end
  if type(v) == 'number' then
    if v ~= v then return 'nan' end
    if v == math.huge then return 'inf' elseif v == -math.huge then return '-inf' end
    return json.number(v)
  end
  local s = tostring(v)
  if s:find('[",\r\n]') then s = '"' .. s:gsub('"', '""') .. '"' end
  return s
end

-- export.csv(path, rows, columns) -> path: one line a row (a table), the
-- columns in the order given (default: the keys of the rows, sorted, 'step'
-- or 'name' first). Numbers are written so that they read back exactly.
function export.csv(path, rows, columns)
  if type(path) ~= 'string' or path == '' then error(('export.csv: path must be a file path, got %s'):format(type(path)), 2) end
  if type(rows) ~= 'table' then error(('export.csv: rows must be a list of tables, got %s'):format(type(rows)), 2) end
  if columns == nil then
    local seen = {}
    columns = {}
    for _, r in ipairs(rows) do
      for k in pairs(r) do
        if type(k) == 'string' and not seen[k] then seen[k] = true; columns[#columns + 1] = k end
      end
    end
    table.sort(columns, function(a, b)
      local first = {step = 1, name = 1}
      if (first[a] or 0) ~= (first[b] or 0) then return (first[a] or 0) > (first[b] or 0) end
      return a < b
    end)
  end
  local lines = {}
  local head = {}
  for i, c in ipairs(columns) do head[i] = csv_cell(c) end
  lines[1] = table.concat(head, ',')
  for i, r in ipairs(rows) do
    if type(r) ~= 'table' then error(('export.csv: row %d is a %s, not a table'):format(i, type(r)), 2) end
    local cells = {}
    for c, name in ipairs(columns) do
      local v = r[name]
      if type(v) == 'table' or type(v) == 'function' or type(v) == 'userdata' then v = nil end
      cells[c] = csv_cell(v)
    end
    lines[#lines + 1] = table.concat(cells, ',')
  end
  return fs.write_atomic(path, table.concat(lines, '\r\n') .. '\r\n')
end

-- export.read_csv(path) -> rows, columns: what export.csv wrote (numbers come
-- back as numbers, empty cells as nil).
function export.read_csv(path)
  local text = fs.read(path)
  local records, record, field, i, n = {}, {}, {}, 1, #text
  local quoted = false
  local function end_field() record[#record + 1] = table.concat(field); field = {} end
  local function end_record() end_field(); records[#records + 1] = record; record = {} end
  while i <= n do
    local c = text:sub(i, i)
    if quoted then
      if c == '"' and text:sub(i + 1, i + 1) == '"' then field[#field + 1] = '"'; i = i + 1
      elseif c == '"' then quoted = false
      else field[#field + 1] = c end
    elseif c == '"' then quoted = true
    elseif c == ',' then end_field()
    elseif c == '\r' and text:sub(i + 1, i + 1) == '\n' then end_record(); i = i + 1
    elseif c == '\n' then end_record()
    else field[#field + 1] = c end
    i = i + 1
  end
  if #field > 0 or #record > 0 then end_record() end
  local columns = table.remove(records, 1) or {}
  local rows = {}
  for r, cells in ipairs(records) do
    local row = {}
    for c, name in ipairs(columns) do
      local s = cells[c]
      if s ~= nil and s ~= '' then
        local v = tonumber(s)
        if s == 'nan' then v = 0 / 0 elseif s == 'inf' then v = math.huge elseif s == '-inf' then v = -math.huge end
        row[name] = v or s
      end
    end
    rows[r] = row
  end
  return rows, columns
end

-- ---- TensorBoard event files --------------------------------------------------
-- A file of records: an 8-byte little-endian length, its masked CRC-32C, an
-- Event protocol buffer, and its masked CRC-32C. The first Event names the
-- file version; each scalar is an Event {wall_time, step, summary {value
-- {tag, simple_value}}}.

local crc_table = {}
for i = 0, 255 do
  local c = i
  for _ = 1, 8 do
    if bit.band(c, 1) ~= 0 then c = bit.bxor(bit.rshift(c, 1), 0x82F63B78) else c = bit.rshift(c, 1) end
  end
  crc_table[i] = c
end

local function crc32c(s)
  local c = bit.bnot(0)
  for i = 1, #s do
    c = bit.bxor(crc_table[bit.band(bit.bxor(c, s:byte(i)), 0xff)], bit.rshift(c, 8))
  end
  return bit.bnot(c)
end

local function u32(x)  -- 4 bytes, little-endian, of a 32-bit value
  x = x % 2 ^ 32
  return string.char(x % 256, math.floor(x / 256) % 256, math.floor(x / 65536) % 256, math.floor(x / 16777216) % 256)
end

local function masked(s)
  local c = crc32c(s)
  local rotated = bit.bor(bit.rshift(c, 15), bit.lshift(c, 17))
  return u32((rotated % 2 ^ 32 + 0xa282ead8) % 2 ^ 32)
end

-- export.varint(n) -> the protocol-buffer varint of a non-negative integer
-- n: seven bits a byte, lowest first, the high bit set on all but the last
function export.varint(n)
  local out = {}
  repeat
    local b = n % 128
    n = math.floor(n / 128)
    out[#out + 1] = string.char(n > 0 and b + 128 or b)
  until n == 0
  return table.concat(out)
end
local varint = export.varint

assert(ffi.abi('le'), 'export: TensorBoard files are written on little-endian machines only')
local function double_bytes(v) return ffi.string(ffi.new('double[1]', v), 8) end
local function float_bytes(v) return ffi.string(ffi.new('float[1]', v), 4) end
local function field(number, wire, payload) return varint(number * 8 + wire) .. payload end
local function bytes_field(number, s) return field(number, 2, varint(#s) .. s) end

local function record(event)
  local n = #event
  local len = u32(n % 2 ^ 32) .. u32(math.floor(n / 2 ^ 32))
  return len .. masked(len) .. event .. masked(event)
end

local written = 0

-- export.tensorboard(dir, scalars) -> path of the event file written in dir.
-- scalars: a list of {tag = 'train/loss', step = 12, value = 2.5[, wall_time]}.
function export.tensorboard(dir, scalars)
  if type(dir) ~= 'string' or dir == '' then error(('export.tensorboard: dir must be a folder path, got %s'):format(type(dir)), 2) end
  if type(scalars) ~= 'table' then error(('export.tensorboard: scalars must be a list, got %s'):format(type(scalars)), 2) end
  local now = os.time()
  local parts = {record(field(1, 1, double_bytes(now)) .. bytes_field(3, 'brain.Event:2'))}
  for i, s in ipairs(scalars) do
    if type(s.tag) ~= 'string' or type(s.value) ~= 'number' or type(s.step) ~= 'number' or s.step % 1 ~= 0 or s.step < 0 then
      error(('export.tensorboard: scalar %d needs a tag (string), an integer step >= 0 and a number value'):format(i), 2)
    end
    local value = bytes_field(1, s.tag) .. field(2, 5, float_bytes(s.value))
    local event = field(1, 1, double_bytes(s.wall_time or now)) .. field(2, 0, varint(s.step)) .. bytes_field(5, bytes_field(1, value))
    parts[#parts + 1] = record(event)
  end
  local pipe = io.popen('hostname 2>/dev/null')
  local host = ((pipe and pipe:read('*l')) or ''):gsub('[^%w%.%-]', '')
  if pipe then pipe:close() end
  written = written + 1  -- two exports in one second get two files
  local path = ('%s/events.out.tfevents.%d.%s.%d'):format(dir, now, host ~= '' and host or 'localhost', written)
  return fs.write_atomic(path, table.concat(parts))
end

return export
