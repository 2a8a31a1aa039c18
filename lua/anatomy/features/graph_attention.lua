-- Frozen attention for sae.attribute's backward passes without holding any
-- (B, H, T, T) pattern. With the pattern frozen, an attention's output is
-- P v with P fixed: the gradient reaches only v, as P^T g. The hooks here
-- detach the queries, keys and values inside the block (so that autograd
-- keeps no pattern for any copy of the prompt), give z a gradient path to v
-- alone, and compute P^T g in the gradient hook from the clean queries and
-- keys of one copy (T x H x D each), a chunk of query positions at a time:
-- the patterns are recomputed as the block computes them (scale, soft-cap,
-- causal and sliding-window masks, keys shared across groups of heads) and
-- none is kept beyond a chunk's (H, P, T). nn.Attention and nn.RoPEAttention
-- are handled so; any other attention keeps the pattern hook's detach.
local torch = require('anatomy.torch')
local hooks = require('anatomy.probe.hooks')
local nn = require('anatomy.nn')

local M = {}

M.chunk = 2 ^ 24  -- floats of a chunk's (H, P, T) scores (tests make it small)

local KNOWN = {['nn.Attention'] = {q = 'q', k = 'k'}, ['nn.RoPEAttention'] = {q = 'rot_q', k = 'rot_k'}}

local function module_named(model, name)
  for n, m in model:named_modules() do if n == name then return m end end
end

-- P^T g for g (B, T, H, D): the pattern from q (T, H, D) and k (T, Hk, D)
local function transposed_pattern_times(how, q, k, g)
  local B, T, H, D = g:size(1), g:size(2), g:size(3), g:size(4)
  local qh = q:permute(2, 1, 3):float()  -- (H, T, D)
  local kh = k:permute(2, 1, 3):float()
  if kh:size(1) ~= H then kh = kh:index_select(1, how.group) end
  local gh = g:permute(3, 2, 1, 4):reshape(H, T, B * D):float()  -- (H, T, B·D)
  local out = torch.zeros({H, T, B * D}, {device = g.device})
  local P = math.max(1, math.min(T, math.floor(M.chunk / (H * T))))
  local j = torch.arange(1, T + 1):to(g.device):view(1, T)
  for t0 = 1, T, P do
    local n = math.min(P, T - t0 + 1)
    local s = qh:narrow(2, t0, n):matmul(kh:transpose(2, 3)) * how.scale  -- (H, n, T)
    if how.softcap > 0 then s = (s / how.softcap):tanh() * how.softcap end
    local i = torch.arange(t0, t0 + n):to(g.device):view(n, 1)
    local blocked = how.causal and j:gt(i) or nil
    if how.window > 0 then
      local far = (i - j):ge(how.window)
      blocked = blocked and blocked:logical_or(far) or far
    end
    if blocked then s = s:masked_fill(blocked, -math.huge) end
    out:add_(s:softmax(-1):transpose(2, 3):matmul(gh:narrow(2, t0, n)))  -- (H, T, B·D)
  end
  return out:view(H, T, B, D):permute(3, 2, 1, 4):contiguous():to(g.dtype)
end

-- M.attach(model, names, hs) -> handled: the hooks above on each attention
-- block named (one a layer) that this knows, their handles appended to hs;
-- handled[block .. '.pattern'] is true for those (their pattern carries no
-- gradient and needs no hook)
function M.attach(model, names, hs)
  local handled = {}
  for _, name in ipairs(names) do
    local m = module_named(model, name)
    local points = m and KNOWN[nn.typename(m)]
    local made = m and rawget(m, '_made_with')
    if points and made then
      local H, Hk = made.heads, made.kv_heads or made.heads
      local how = {causal = made.causal ~= false, window = made.sliding_window or 0, softcap = made.softcap or 0}
      local group = {}
      for h = 1, H do group[h] = math.floor((h - 1) / (H / Hk)) + 1 end
      how.group = torch.tensor(group):long()
      local st = {}
      handled[name .. '.pattern'] = true
      hs[#hs + 1] = hooks.replace(model, name .. '.' .. points.q, function(t)
        st.q = t[1]:detach()
        return t:detach()
      end)
      hs[#hs + 1] = hooks.replace(model, name .. '.' .. points.k, function(t)
        st.k = t[1]:detach()
        return t:detach()
      end)
      hs[#hs + 1] = hooks.replace(model, name .. '.v', function(t)
        st.v = t
        return t:detach()
      end)
      hs[#hs + 1] = hooks.replace(model, name .. '.z', function(t)
        local v = st.v  -- (B, T, Hk, D), in the graph
        if not v.requires_grad then return nil end
        local w = Hk == H and v * 1 or v:index_select(3, how.group:to(v.device))
        local q, k = st.q, st.k
        local h = {causal = how.causal, window = how.window, softcap = how.softcap,
          scale = (made.scale or 0) > 0 and made.scale or 1 / math.sqrt(q:size(-1)), group = how.group:to(q.device)}
        w:register_hook(function(g) return transposed_pattern_times(h, q, k, g) end)
        st.v = nil
        return t + (w - w:detach())
      end)
    end
  end
  return handled
end

return M
