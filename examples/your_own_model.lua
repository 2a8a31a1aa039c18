-- Your own model: an attention block and a residual written in Lua, composed
-- with nn.Sequential, trained, and dissected with every column of the
-- autopsy. What each part of the model protocol unlocks:
--   layers()       the autopsy's rows (default: the children of the largest
--                  numbered container, here the nn.Repeat)
--   readout(h)     the logit lens (default for nn.Sequential: the children
--                  after the stack, here norm and head)
--   context()      the sequence length (default: the embedding's positions)
--   keep_pattern(keep, grad) / pattern()   attention entropy and diagonal mass
--   anatomy examples/your_own_model.lua [--steps=300] [--data=FILE]
local cfg = torch.config.parse({steps = 300, dim = 64, layers = 4, seq = 64, batch = 32, lr = 3e-3, data = '', seed = 1337,
  out = 'out/your_own_model'}, arg, 'usage: anatomy examples/your_own_model.lua [--key=value ...]')

-- Causal self-attention, one head, from tensor ops. It publishes its
-- attention matrix (B, 1, T, T) when a probe asks, as the built-in ones do.
local SelfAttention = nn.block('SelfAttention', function(self, dim)
  self.qkv = nn.Linear(dim, 3 * dim)
  self.proj = nn.Linear(dim, dim)
end)

function SelfAttention:keep_pattern(keep, grad) rawset(self, '_keep', keep and {grad = grad} or nil) end
function SelfAttention:pattern() return rawget(self, '_pattern') end

function SelfAttention:forward(x)                        -- x: (B, T, C)
  local T, C = x:size(2), x:size(3)
  local q, k, v = unpack(self.qkv(x):chunk(3, -1))       -- (B, T, C) each
  local scores = q:matmul(k:transpose(-2, -1)) / math.sqrt(C)           -- (B, T, T)
  local future = torch.ones(T, T, {dtype = 'bool'}):triu(1)
  local att = scores:masked_fill(future, -math.huge):softmax(-1)
  local keep = rawget(self, '_keep')
  if keep then rawset(self, '_pattern', (keep.grad and att or att:detach()):unsqueeze(2)) end
  local out = self.proj(att:matmul(v))
  return out
end

-- A residual whose branch is scaled by a learned scalar: x + alpha f(x).
local ScaledResidual = nn.block('ScaledResidual', function(self, inner)
  self.inner = inner
  self.alpha = nn.Parameter(torch.tensor({0.5}))
end)

function ScaledResidual:forward(x)
  local out = x + self.alpha * nn.call_child(self, 'inner', self.inner, x)
  return out
end

local corpus = data.text(cfg.data ~= '' and cfg.data or data.default_text())
torch.manual_seed(cfg.seed)
local model = nn.Sequential{
  {'embed', nn.Embedding(corpus.vocab_size, cfg.dim, {positions = cfg.seq})},
  {'blocks', nn.Repeat(cfg.layers, function()
    return ScaledResidual(nn.Sequential{nn.LayerNorm(cfg.dim), SelfAttention(cfg.dim)})
  end)},
  {'norm', nn.LayerNorm(cfg.dim)},
  {'head', nn.Linear(cfg.dim, corpus.vocab_size)},
}
print(model)
print(('context %d; layers: %s'):format(model:context(), model:layers()[1][1] .. ' ..'))

local run = train.fit(model, corpus, {steps = cfg.steps, batch = cfg.batch, lr = cfg.lr, warmup = math.min(30, cfg.steps),
  probe = {every = math.max(1, math.floor(cfg.steps / 6))}})
local a = autopsy.run(model, corpus, {history = run, batch = cfg.batch, steps = 2, config = cfg})
print(a)
a:report(cfg.out .. '/autopsy.html')
print(('report: %s/autopsy.html'):format(cfg.out))
