-- models.stateful{vocab, dim, heads, layers, seq, ffn, norm = 'pre', activation = 'relu'}
-- The "Stateful GPT": a gpt whose token embeddings are enriched by the last
-- hidden state h of the previous position, from a previous pass:
--   x' = x + relu((h Wk) ⊙ (x Wq)) ⊙ (h Wv)
-- forward(ids, hidden) takes that previous pass's hidden states (B, T, C), or
-- nil for a plain pass, and returns logits (B, T, V) and this pass's hidden
-- states (B, T, C). step() runs it as an RNN, carrying h token to token.
local torch = require('anatomy.torch')
local nn = require('anatomy.nn')
local models = require('anatomy.models')

local Enrich = nn.block('models.Enrich', function(self, dim)
  self.q = nn.Linear(dim, dim, {bias = false})
  self.k = nn.Linear(dim, dim, {bias = false})
  self.v = nn.Linear(dim, dim, {bias = false})
end)
models.Enrich = Enrich

-- x (B, T, C) token embeddings; h (B, T, C) the state each position is enriched with
function Enrich:forward(x, h)
  return x + (self.k(h) * self.q(x)):relu() * self.v(h)
end

local Stateful = nn.block('models.Stateful', function(self, cfg)
  models.check_config('stateful', cfg, {'vocab', 'dim', 'heads', 'layers', 'seq', 'ffn'}, {'norm', 'activation', 'residual'})
  local c = {}
  for k, v in pairs(cfg) do c[k] = v end
  c.norm = c.norm or 'pre'
  rawset(self, 'config', c)
  self.embed = nn.Embedding(c.vocab, c.dim, {positions = c.seq})
  self.enrich = Enrich(c.dim)
  self.blocks = nn.Repeat(c.layers, function() return models.GPTBlock(c) end)
  if c.norm == 'pre' then self.ln_f = nn.LayerNorm(c.dim) end
  self.head = nn.Linear(c.dim, c.vocab)
end)
models.Stateful = Stateful

-- The state of position t comes from position t - 1 of the previous pass;
-- the first position gets zeros.
local function shift_right(h)
  local B, T, C = h:size(1), h:size(2), h:size(3)
  local zero = torch.zeros(B, 1, C, {dtype = h.dtype, device = h.device})
  if T == 1 then return zero end
  return torch.cat({zero, h:narrow(2, 1, T - 1)}, 2)
end

-- ids (B, T), hidden (B, T, C) or nil -> logits (B, T, V), hidden (B, T, C)
function Stateful:forward(ids, hidden)
  models.check_ids(self, ids)
  local x = self.embed(ids)
  if hidden ~= nil then x = self.enrich(x, shift_right(hidden)) end
  local h = self.blocks(x)
  if self.ln_f then h = self.ln_f(h) end
  return self.head(h), h
end

-- RNN-style inference. ids (B, t): the context so far; state: what the last
-- call returned (nil at the start). Each position is enriched with the hidden
-- state its predecessor had when it was the newest token.
-- Returns the logits of the last position (B, V) and the new state.
function Stateful:step(ids, state)
  local B, T = ids:size(1), ids:size(2)
  local known = state and state.hidden                     -- (B, t - 1, C)
  local hidden
  if known then
    local missing = T - known:size(2)
    hidden = missing > 0 and torch.cat({known, torch.zeros(B, missing, known:size(3), {dtype = known.dtype, device = known.device})}, 2) or known
  end
  local logits, h = self:forward(ids, hidden)
  local newest = h:narrow(2, T, 1):detach()
  local kept = known and torch.cat({known:narrow(2, 1, math.min(known:size(2), T - 1)), newest}, 2) or newest
  return logits:select(2, T), {hidden = kept}
end

-- The logit lens and the printed settings are the GPT's: the same final
-- norm and head, the same config keys.
Stateful.readout = models.GPT.readout
Stateful.extra_repr = models.GPT.extra_repr

-- models.stateful{vocab, dim, heads, layers, seq, ffn, ...} -> a Stateful GPT that can carry its hidden states
-- between passes (model:step; train.fit's recurrence)
local function new(cfg) return Stateful(cfg) end

return {new = new, Stateful = Stateful}
