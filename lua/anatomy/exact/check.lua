-- Checking an exact trace against LibTorch: the same forward pass in float64
-- (exact.float_forward) and the largest difference over every value
-- (trace:compare); exact/init.lua binds them.
local torch = require('anatomy.torch')
local V = require('anatomy.exact.value')
local split_tokens = require('anatomy.exact.model').split_tokens
local each_value = require('anatomy.exact.walk').each_value

local check = {}

-- ---- the float forward, for checking ----------------------------------------------------------

local function tensor(m)
  local rows = {}
  for i, row in ipairs(m) do
    rows[i] = {}
    for j, v in ipairs(row) do rows[i][j] = V.tonumber(v) end
  end
  return torch.tensor(rows, {dtype = 'float64'})
end

local function vtensor(v)
  local t = {}
  for i, x in ipairs(v) do t[i] = V.tonumber(x) end
  return torch.tensor(t, {dtype = 'float64'})
end

-- exact.float_forward(model, tokens) -> {[step key] = float64 tensor}: the same
-- forward pass with LibTorch's float64 kernels (matmul, softmax, var, sqrt),
-- for checking the trace (trace:compare).
function check.float_forward(model, tokens)
  local _, ids = split_tokens(model, tokens)
  local T = #ids
  local out = {}
  local E = tensor(model.E)
  local index = torch.tensor(ids, {dtype = 'int64'})
  local emb = E:index_select(1, index)
  out.embed = emb
  local x = emb + tensor(model.P):narrow(1, 1, T)
  out['+pos'] = x
  for b, blk in ipairs(model.blocks) do
    local prefix = #model.blocks > 1 and ('block' .. b .. '.') or ''
    local function lin(input, W, bias)
      local y = input:matmul(tensor(W))
      if bias then y = y + vtensor(bias) end
      return y
    end
    local q, k, v = lin(x, blk.Wq, blk.bq), lin(x, blk.Wk, blk.bk), lin(x, blk.Wv, blk.bv)
    out[prefix .. 'Q'], out[prefix .. 'K'], out[prefix .. 'V'] = q, k, v
    local dh, dvh = q:size(2) / blk.heads, v:size(2) / blk.heads
    local heads = {}
    for h = 1, blk.heads do
      local qh, kh, vh = q:narrow(2, (h - 1) * dh + 1, dh), k:narrow(2, (h - 1) * dh + 1, dh), v:narrow(2, (h - 1) * dvh + 1, dvh)
      local s = qh:matmul(kh:t()) * V.tonumber(blk.scale)
      if blk.causal then
        local mask = torch.ones(T, T, {dtype = 'bool'}):triu(1)
        s = s:masked_fill(mask, -math.huge)
      end
      local p = s:softmax(2)
      local suffix = blk.heads > 1 and ('#' .. h) or ''
      out[prefix .. 'scores' .. suffix], out[prefix .. 'softmax' .. suffix] = s, p
      heads[h] = p:matmul(vh)
    end
    local a = torch.cat(heads, 2)
    out[prefix .. 'attention'] = a
    if blk.Wo then
      a = lin(a, blk.Wo, blk.bo)
      out[prefix .. 'attention.out'] = a
    end
    local function norm(r, ln, name)
      local mean = r:mean(2, true)
      local c = r - mean
      local var = (c * c):mean(2, true)
      local std = (var + V.tonumber(ln.eps)):sqrt()
      -- a zero std leaves the centered values undivided, as the exact trace does
      local safe = torch.where(std:eq(0), torch.ones_like(std), std)
      local y = c / safe * vtensor(ln.gamma) + vtensor(ln.beta)
      out[prefix .. name .. '.mean'], out[prefix .. name .. '.centered'] = mean:squeeze(2), c
      out[prefix .. name .. '.var'], out[prefix .. name .. '.std'], out[prefix .. name .. '.out'] = var:squeeze(2), std:squeeze(2), y
      return y
    end
    local r = x + a
    out[prefix .. 'residual1'] = r
    x = norm(r, blk.ln1, 'ln1')
    if blk.W1 then
      local h = lin(x, blk.W1, blk.b1)
      local act = blk.act == 'relu' and h:relu() or h
      local m = lin(act, blk.W2, blk.b2)
      out[prefix .. 'mlp.hidden'], out[prefix .. 'mlp.act'], out[prefix .. 'mlp.out'] = h, act, m
      r = x + m
      out[prefix .. 'residual2'] = r
      x = norm(r, blk.ln2, 'ln2')
    end
  end
  out.logits = model.U and x:matmul(tensor(model.U)) or x:matmul(E:t())
  return out
end

-- trace:compare(floats) -> largest |exact − float| over every value of every
-- step that has a float counterpart, the number of values compared, and the
-- step where the difference is largest.
function check.compare(trace, floats)
  floats = floats or check.float_forward(trace.model, trace.tokens)
  local worst, count, where_worst = 0, 0, nil
  for _, s in ipairs(trace.steps) do
    local key = s:key()
    local t = floats[key]
    if t then
      each_value(s, function(v, pos, i)
        local f = i and t[pos][i]:item() or t[pos]:item()
        local d = math.abs(V.tonumber(v) - f)
        if d ~= d then d = math.huge end
        count = count + 1
        if d > worst or where_worst == nil then
          if d >= worst then worst, where_worst = d, ('%s at position %d%s'):format(key, pos, i and (', entry ' .. i) or '') end
        end
      end)
    end
  end
  return worst, count, where_worst
end

return check
