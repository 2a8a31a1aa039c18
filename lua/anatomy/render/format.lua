-- Numbers and shapes as anatomy's tables and errors print them. (The
-- autopsy's own table, legend and terminal charts are autopsy/text.lua.)
local format = {}

-- format.shape(t) -> a tensor's shape as errors and tables write it ('2x3'; '' for a scalar)
function format.shape(t) return table.concat(t:size(), 'x') end

-- format.count(n) -> the whole number n with thousands separators
-- ('1,611,329', '-12,000')
function format.count(n)
  local s = tostring(math.floor(n))
  repeat
    local k
    s, k = s:gsub('^(-?%d+)(%d%d%d)', '%1,%2')
  until k == 0
  return s
end

-- format.number(v, digits) -> '-' for nil, 'nan', scientific for very large or small values
local function fmt(v, digits)
  if v == nil then return '-' end
  if v ~= v then return 'nan' end
  local a = math.abs(v)
  if a ~= 0 and (a >= 1e5 or a < 1e-3) then return ('%.2e'):format(v) end
  return ('%.' .. (digits or 3) .. 'f'):format(v)
end
format.number = fmt


return format
