-- nn.MoE(dim, hidden, experts, top_k, {norm_topk_prob = true, bias = false}):
-- a sparse mixture of experts in place of an MLP (Mixtral's
-- MixtralSparseMoeBlock). A router `gate` (Linear dim -> experts, no bias)
-- scores each token; the top_k experts by softmax probability (in float32)
-- each run on their tokens alone, and their outputs add up weighted by those
-- probabilities, renormalised to sum to one when norm_topk_prob. Children:
-- gate and experts (an nn.ModuleList of nn.MoEExpert: the SwiGLU's gate, up
-- and down Linears). E experts, K top_k, N = B * T tokens, C dim.
local torch = require('anatomy.torch')
local options = require('anatomy.torch.options')
local nn = require('anatomy.nn')

-- One expert: down(silu(gate(x)) * up(x)), nn.SwiGLU's function and names.
-- nn.MoE runs it on a gather of the tokens routed to it, (n, C), which is no
-- (batch, pos) tensor: so it runs through Expert.forward, out of the probes'
-- sight (their caches, padding and positions read (batch, pos, ...)); its
-- share of the output is the MoE's expert_out point.
local Expert = nn.block('nn.MoEExpert', function(self, dim, hidden, bias)
  self.gate = nn.Linear(dim, hidden, {bias = bias})
  self.up = nn.Linear(dim, hidden, {bias = bias})
  self.down = nn.Linear(hidden, dim, {bias = bias})
end)
nn.MoEExpert = Expert

-- x (..., C) -> (..., C)
function Expert:forward(x)
  local F = nn.functional
  local h = F.linear(x, self.gate.weight, self.gate.bias):silu() * F.linear(x, self.up.weight, self.up.bias)
  return F.linear(h, self.down.weight, self.down.bias)
end

local MoE = nn.class('nn.MoE', nn.Module)
nn.MoE = MoE
MoE.block_role = 'mlp'  -- the layer's MLP to the probes (probe/roles.lua)
-- Hook points: the block's input (what the router and the experts read:
-- TransformerLens's MoE mlp.hook_pre), the router's logits, the weights and
-- experts each token is routed to (its top_k slots, best first: the weights
-- float32, renormalised as the router does; the experts 1-based, int64), and
-- each expert's weighted output (E times the block's output in memory:
-- computed only where a probe names it; the block's output is then their
-- sum, so patching one expert's share moves it). A replacement of the
-- weights is used as given (not renormalised); one of the experts must hold
-- whole numbers in 1..E, distinct for each token, or it is refused.
MoE.declares = {nn.point('input', nn.layouts.stream), nn.point('router_logits', {'batch', 'pos', 'expert'}),
  nn.point('expert_weights', {'batch', 'pos', 'slot'}), nn.point('expert_indices', {'batch', 'pos', 'slot'}),
  nn.point('expert_out', {'batch', 'pos', 'expert', 'd_model'}, 'asked')}

function MoE:__init(dim, hidden, experts, top_k, opts)
  nn.Module.__init(self)
  local where = 'nn.MoE(dim, hidden, experts, top_k, opts)'
  for i, v in ipairs{{dim, 'dim'}, {hidden, 'hidden'}, {experts, 'experts'}, {top_k, 'top_k'}} do
    if v[1] == nil then error(('%s: %s (argument %d) is missing'):format(where, v[2], i), 3) end
    options.whole(v[1], v[2], where, nil, 1, 4)
  end
  if top_k > experts then error(('%s: top_k must be at most experts (%d), got %d'):format(where, experts, top_k), 3) end
  opts = options.check(opts, {'norm_topk_prob', 'bias'}, where, 3)
  for _, k in ipairs{'norm_topk_prob', 'bias'} do
    if opts[k] ~= nil and type(opts[k]) ~= 'boolean' then error(('%s: %s must be true or false, got %s'):format(where, k, tostring(opts[k])), 3) end
  end
  self.num_experts, self.top_k = experts, top_k
  self.norm_topk_prob = opts.norm_topk_prob ~= false
  self.gate = nn.Linear(dim, experts, {bias = false})
  local list = {}
  for e = 1, experts do list[e] = Expert(dim, hidden, opts.bias == true) end
  self.experts = nn.ModuleList(list)
end

-- The experts' weights for each token: weights (N, K) float32 and their
-- experts (N, K), 1-based, from the router's logits (N, E); under
-- moe:set_routing, without the removed experts and with its top_k.
function MoE:route(logits)
  local r = rawget(self, 'routing')
  logits = logits:float()
  if r and r.mask then logits = logits + r.mask:to(logits.device) end  -- -inf: the removed experts' probability 0
  local probs = logits:softmax(-1)
  local w, idx = probs:topk(r and r.top_k or self.top_k)
  if self.norm_topk_prob then w = w / w:sum(-1, true) end
  return w, idx
end

-- probe.scope saves and puts back the routing (moe:set_routing) as it was
MoE.scoped_fields = {'routing'}

-- moe:set_routing{removed = {e, ...}, top_k = k} -> a handle whose :remove()
-- (or moe:set_routing(nil)) routes as built again. Until then the router
-- works as if the removed experts (1-based) did not exist: their logits
-- are -inf, so their probability is 0 and the softmax is over the others
-- (each kept probability p / (1 - the removed ones' p)), from which it
-- picks top_k (default the block's own) experts, renormalised when
-- norm_topk_prob. top_k = 1: the router's top-1 alone (weight 1 when
-- norm_topk_prob, else its probability). The router_logits point still
-- shows the router's own logits. probe.scope puts the routing back as it
-- was, after an error too (MoE.scoped_fields). The autopsy's expert
-- removal and top-1 losses run under it.
function MoE:set_routing(opts)
  local where = 'moe:set_routing{removed, top_k}'
  if opts == nil then rawset(self, 'routing', nil); return nil end
  opts = options.check(opts, {'removed', 'top_k'}, where, 2)
  local E = self.num_experts
  local bias, kept = {}, E
  for e = 1, E do bias[e] = 0 end
  if opts.removed ~= nil and type(opts.removed) ~= 'table' then
    error(('%s: removed must be a list of experts (1..%d), got %s'):format(where, E, type(opts.removed)), 2)
  end
  for _, e in ipairs(opts.removed or {}) do
    if type(e) ~= 'number' or e % 1 ~= 0 or e < 1 or e > E then
      error(('%s: removed experts must be in 1..%d, got %s'):format(where, E, tostring(e)), 2)
    end
    if bias[e] == 0 then kept = kept - 1 end
    bias[e] = -math.huge
  end
  options.whole(opts.top_k, 'top_k', where, nil, 1, 2)
  local k = opts.top_k or self.top_k
  if k > kept then error(('%s: top_k (%d) must be at most the experts kept (%d of %d)'):format(where, k, kept, E), 2) end
  local r = {removed = opts.removed and {unpack(opts.removed)} or nil, top_k = opts.top_k, mask = kept < E and torch.tensor(bias) or nil}
  rawset(self, 'routing', r)
  return {remove = function() if rawget(self, 'routing') == r then rawset(self, 'routing', nil) end end}
end

local integer = {int64 = true, int32 = true, int16 = true, int8 = true, uint8 = true}

-- The routing, w and idx (N, K) each, through the expert_weights and
-- expert_indices points as (B, T, K) where a probe is on the block (else
-- untouched, at no cost); a replacement is checked, and experts that make no
-- index tensor are refused.
local function routed(self, w, idx, B, T)
  if rawget(self, '_hooks') == nil then return w, idx end
  local N, K, E = B * T, w:size(2), self.num_experts
  local given = w:reshape(B, T, K)
  local got = self:hook('expert_weights', given)
  if not rawequal(got, given) then
    if not got.dtype:find('float', 1, true) then error(('nn.MoE: expert_weights must be floating point, got %s'):format(got.dtype), 0) end
    w = got:reshape(N, K):float()
  end
  given = idx:reshape(B, T, K)
  got = self:hook('expert_indices', given)
  if rawequal(got, given) then return w, idx end
  if not integer[got.dtype] then
    error(('nn.MoE: expert_indices must hold whole numbers (an integer tensor), got %s'):format(got.dtype), 0)
  end
  local low, high = got:min():item(), got:max():item()
  if low < 1 or high > E then
    error(('nn.MoE: expert_indices must be experts 1..%d (counted from 1), got %d..%d'):format(E, low, high), 0)
  end
  local sorted = got:sort(-1)
  if K > 1 and sorted:narrow(3, 2, K - 1):eq(sorted:narrow(3, 1, K - 1)):any():item() then
    error('nn.MoE: expert_indices must name distinct experts for each token (as the router picks them)', 0)
  end
  return w, got:reshape(N, K):long()
end

-- Whether a probe asks for the expert_out point (its cost is 'asked').
local function wants_experts(self)
  for _, n in ipairs(rawget(self, '_hooks_wanted') or {}) do
    if n == 'expert_out' then return true end
  end
  return false
end

-- x (B, T, C) -> (B, T, C): each token through its top_k experts, weighted
function MoE:forward(x)
  -- As transformers 5.23's grouped experts: the N * K (token, expert) slots
  -- sorted by expert, their tokens gathered at once, each expert that got any
  -- run on its contiguous rows (the counts read to the host once, not a read
  -- per expert), the rows put back in slot order at once, and each token's K
  -- rows summed with their weights in float32 (one batched product).
  local B, T, C = x:size(1), x:size(2), x:size(3)
  local E, N = self.num_experts, B * T
  x = self:hook('input', x)
  local flat = x:reshape(N, C)
  local logits = self:hook('router_logits', nn.call_child(self, 'gate', self.gate, x))  -- (B, T, E)
  local w, idx = self:route(logits:reshape(N, E))  -- (N, K) each
  w, idx = routed(self, w, idx, B, T)
  local K = idx:size(2)
  local S, dev = N * K, {device = x.device}
  local experts, order = idx:reshape(S):sort(1, false)  -- (S) the slots' experts ascending, and which slot each is
  local counts = experts:reshape(S, 1):eq(torch.arange(1, E + 1, dev):reshape(1, E)):sum(1):tolist()  -- slots per expert
  local token = torch.arange(1, N + 1, dev):reshape(N, 1):expand(N, K):reshape(S):index_select(1, order)  -- (S)
  local xs = flat:index_select(1, token)  -- (S, C) each slot's token, grouped by expert
  local ys, start = {}, 1
  for e = 1, E do
    local n = counts[e]
    if n > 0 then  -- an expert no token picked does not run
      ys[#ys + 1] = Expert.forward(self.experts[e], xs:narrow(1, start, n))  -- (n, C)
      start = start + n
    end
  end
  local _, back = order:sort(1, false)  -- each slot's row among the sorted
  local y = (#ys == 1 and ys[1] or torch.cat(ys, 1)):index_select(1, back):float():reshape(N, K, C)  -- token n's K experts' outputs
  if wants_experts(self) then  -- (B, T, E, C): each token's row of its experts' weighted outputs, 0 elsewhere
    local each = torch.zeros({N * E, C}, {dtype = x.dtype, device = x.device})
    each[(torch.arange(0, N, dev):reshape(N, 1) * E + idx):reshape(S)] = (y * w:reshape(N, K, 1)):reshape(S, C):to(x.dtype)
    each = self:hook('expert_out', each:reshape(B, T, E, C))
    return each:sum(3)  -- the block's output their sum
  end
  return w:reshape(N, 1, K):bmm(y):to(x.dtype):reshape(B, T, C)  -- weighted in float32, as transformers
end

-- What print(model) shows beside its children
function MoE:extra_repr()
  local r = rawget(self, 'routing')
  local routing = r and (', routing: %s%s'):format(r.removed and ('experts %s removed'):format(table.concat(r.removed, ',')) or '',
    r.top_k and ((r.removed and ', ' or '') .. 'top_k ' .. r.top_k) or '') or ''
  return ('experts=%d, top_k=%d%s%s'):format(self.num_experts, self.top_k, self.norm_topk_prob and '' or ', norm_topk_prob=false', routing)
end

return MoE
