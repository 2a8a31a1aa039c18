-- models.vibenet{vocab, dim, layers, seq, block = 'plain'|'ffn'|'gate'|'hyper', streams = 4, constraint = 'sinkhorn'|'none'}
-- VibeNet: token + learned position embedding, `layers` blocks around a
-- parameter-free attention, then an expansion Linear(dim, 3·dim), GELU and an
-- untied head Linear(3·dim, vocab). Blocks:
--   plain  x + attn(norm(x))
--   ffn    x + gelu(ffn(attn(norm(x))))
--   gate   gate(x) + gelu(ffn(attn(norm(x))))      (gate: Linear(dim, dim))
--   hyper  hyper-connections (nn.HyperConnections, Sinkhorn) around attn(norm(x))
-- B batch, T time, C channels (dim), V vocab.
local nn = require('anatomy.nn')
local models = require('anatomy.models')

-- norm -> attention [-> ffn -> gelu]
local VibeBlock = nn.block('models.VibeBlock', function(self, dim, with_ffn)
  self.norm = nn.RMSNorm(dim)
  self.attn = nn.VibeAttention()
  if with_ffn then
    self.ffn = nn.Linear(dim, dim)
    self.act = nn.GELU()
  end
end)
models.VibeBlock = VibeBlock

-- block(x) -> f(x) = attn(norm(x)) [then gelu(ffn(.))]: the wrapped function; the residual wrapper adds x
function VibeBlock:forward(x)
  local y = self.attn(self.norm(x))
  if self.ffn then y = self.act(self.ffn(y)) end
  return y
end

-- models.vibe_head(m, dim, vocab): VibeNet's output, the children expand
-- (Linear(dim, 3 dim)), act (GELU) and head (Linear(3 dim, vocab)); the funnel
-- ends the same way.
local function vibe_head(m, dim, vocab)
  m.expand = nn.Linear(dim, 3 * dim)
  m.act = nn.GELU()
  m.head = nn.Linear(3 * dim, vocab)
end

local VibeNet = nn.block('models.VibeNet', function(self, cfg)
  models.check_config('vibenet', cfg, {'vocab', 'dim', 'layers', 'seq'}, {'block', 'streams', 'constraint'})
  local kind = cfg.block or 'plain'
  local dim = cfg.dim
  local factories = {
    plain = function() return nn.Residual(VibeBlock(dim, false)) end,
    ffn = function() return nn.Residual(VibeBlock(dim, true)) end,
    gate = function() return nn.Gate(VibeBlock(dim, true), dim) end,
    hyper = function()
      return nn.HyperConnections(VibeBlock(dim, false), dim, {streams = cfg.streams or 4, constraint = cfg.constraint})
    end,
  }
  if not factories[kind] then
    error(("models.vibenet: block must be 'plain', 'ffn', 'gate' or 'hyper', got '%s'"):format(tostring(kind)), 4)
  end
  rawset(self, 'config', cfg)
  self.embed = nn.Embedding(cfg.vocab, dim, {positions = cfg.seq})
  if kind == 'hyper' then self.split = nn.ExpandStreams(cfg.streams or 4) end
  self.blocks = nn.Repeat(cfg.layers, factories[kind])
  if kind == 'hyper' then self.merge = nn.MergeStreams() end
  vibe_head(self, dim, cfg.vocab)
end)
models.VibeNet = VibeNet

-- ids (B, T) int64, 1-based -> logits (B, T, V)
function VibeNet:forward(ids)
  models.check_ids(self, ids)
  local x = self.embed(ids)                 -- (B, T, C)
  if self.split then x = self.split(x) end  -- (B, T, n, C)
  x = self.blocks(x)
  if self.merge then x = self.merge(x) end
  return self.head(self.act(self.expand(x)))
end

-- The head applied to a hidden state (B, T, C) or streams (B, T, n, C): the logit lens.
function VibeNet:readout(h)
  if self.merge and h:dim() == 4 then h = self.merge(h) end
  return self.head(self.act(self.expand(h)))
end

-- The model's settings as print(model) shows them: vocab, dim, layers, seq, block
function VibeNet:extra_repr()
  local c = self.config
  return ('vocab=%d, dim=%d, layers=%d, seq=%d, block=%s'):format(c.vocab, c.dim, c.layers, c.seq, c.block or 'plain')
end

-- models.vibenet{vocab, dim, layers, seq, block = 'plain'|'ffn'|'gate'|'hyper', streams, constraint} -> a VibeNet
-- (the file's header says what each block is)
local function new(cfg) return VibeNet(cfg) end

return {new = new, VibeNet = VibeNet, vibe_head = vibe_head}
