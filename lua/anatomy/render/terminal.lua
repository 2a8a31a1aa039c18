-- terminal: charts for the REPL and scripts, in text: an attention map with
-- token labels, a heatmap with row and column labels, signed bars. Each
-- prints its numbers or its scale, so values can be read, not guessed.
local terminal = {}

local shades = {' ', '░', '▒', '▓', '█'}

-- A token's text made printable in one short cell: newlines and tabs as \n
-- and \t, a leading space as '␣', cut to `width` characters.
function terminal.token_label(s, width)
  width = width or 10
  s = tostring(s):gsub('\n', '\\n'):gsub('\t', '\\t'):gsub('\r', '\\r'):gsub('^ ', '␣')
  local chars = {}
  for c in s:gmatch('[%z\1-\127\194-\244][\128-\191]*') do chars[#chars + 1] = c end
  if #chars > width then return table.concat(chars, '', 1, width - 1) .. '…' end
  return s
end

-- Display width of a UTF-8 string (one column per character).
local function width_of(s)
  local n = 0
  for _ in s:gmatch('[%z\1-\127\194-\244][\128-\191]*') do n = n + 1 end
  return n
end

local function pad(s, w) return s .. (' '):rep(math.max(0, w - width_of(s))) end
local function lpad(s, w) return (' '):rep(math.max(0, w - width_of(s))) .. s end

-- terminal.attention_map(m, tokens, title, numbers) -> text: m (Tq, Tk), a
-- row per query token, a column per key token (numbered; the numbers' tokens
-- listed under the map), each cell shaded by weight (' ░▒▓█' for 0 to the
-- map's largest weight), or with numbers = true the weights themselves.
function terminal.attention_map(m, tokens, title, numbers)
  local Tq, Tk = m:size(1), m:size(2)
  local rows = m:tolist()
  local hi = m:max():item()
  local labels = {}
  local lw = 3
  for t = 1, math.max(Tq, Tk) do
    labels[t] = terminal.token_label(tokens and tokens[t] or ('#' .. t), 10)
    lw = math.max(lw, width_of(labels[t]))
  end
  local cell = numbers and 5 or 1
  local lines = {('%s  (rows: query tokens, columns: key tokens 1..%d; %s)'):format(title, Tk,
    numbers and 'weights' or ("' ░▒▓█' = 0 to %.3g"):format(hi))}
  local head = {(' '):rep(lw + 5)}
  for k = 1, Tk do
    head[#head + 1] = numbers and lpad(tostring(k), cell) .. ' ' or tostring(k % 10)
  end
  lines[#lines + 1] = table.concat(head)
  for q = 1, Tq do
    local parts = {('%3d %s '):format(q, pad(labels[q], lw))}
    for k = 1, Tk do
      local v = rows[q][k]
      if numbers then
        parts[#parts + 1] = (k > q and v == 0) and lpad('.', cell) .. ' ' or ('%5.2f '):format(v)
      else
        local level = hi > 0 and math.floor(v / hi * (#shades - 1) + 0.5) + 1 or 1
        parts[#parts + 1] = shades[math.max(1, math.min(#shades, level))]
      end
    end
    lines[#lines + 1] = table.concat(parts)
  end
  return table.concat(lines, '\n')
end

-- terminal.heatmap(title, row_labels, col_labels, matrix[, number]) -> text:
-- each value printed (`number`, a format; 3 significant digits unless
-- given) with a shade of its place between the matrix's smallest and
-- largest values.
function terminal.heatmap(title, row_labels, col_labels, matrix, number)
  number = number or '%.3g'
  local lo, hi = math.huge, -math.huge
  for _, row in ipairs(matrix) do
    for _, v in ipairs(row) do
      if v == v then lo, hi = math.min(lo, v), math.max(hi, v) end
    end
  end
  local lw = 4
  for _, l in ipairs(row_labels) do lw = math.max(lw, width_of(l)) end
  local cw = number == '%.3g' and 8 or 10
  for _, l in ipairs(col_labels) do cw = math.max(cw, math.min(12, width_of(l) + 1)) end
  local lines = {('%s  (shade: %.3g to %.3g)'):format(title, lo, hi)}
  local head = {(' '):rep(lw + 1)}
  for _, l in ipairs(col_labels) do head[#head + 1] = lpad(terminal.token_label(l, cw - 1), cw) end
  lines[#lines + 1] = table.concat(head)
  for r, row in ipairs(matrix) do
    local parts = {pad(row_labels[r], lw) .. ' '}
    for _, v in ipairs(row) do
      local level = hi > lo and math.floor((v - lo) / (hi - lo) * (#shades - 1) + 0.5) + 1 or 1
      parts[#parts + 1] = lpad(number:format(v), cw - 1) .. (v == v and shades[math.max(1, math.min(#shades, level))] or ' ')
    end
    lines[#lines + 1] = table.concat(parts)
  end
  return table.concat(lines, '\n')
end

-- terminal.signed_bars(title, rows, width) -> text: rows = {{label, value}},
-- a bar left of the axis for a negative value and right for a positive one,
-- each with its value.
function terminal.signed_bars(title, rows, width)
  width = width or 24
  local big, lw = 0, 4
  for _, r in ipairs(rows) do
    big = math.max(big, math.abs(r[2]))
    lw = math.max(lw, width_of(r[1]))
  end
  local lines = {title}
  for _, r in ipairs(rows) do
    local n = big > 0 and math.floor(math.abs(r[2]) / big * width + 0.5) or 0
    local left = r[2] < 0 and lpad(('█'):rep(n), width) or (' '):rep(width)
    local right = r[2] > 0 and pad(('█'):rep(n), width) or (' '):rep(width)
    lines[#lines + 1] = ('%s %s│%s %+.4g'):format(pad(r[1], lw), left, right, r[2])
  end
  return table.concat(lines, '\n')
end

return terminal
