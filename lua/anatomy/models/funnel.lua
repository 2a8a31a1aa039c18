-- models.funnel{vocab, seq, widths = {512, 256, 128, 64}, attentions = {3, 4, 8, 16}}
-- Progressive width: stage s runs attentions[s] parameter-free attention
-- blocks (x + attn(norm(x))) at width widths[s], then a learned Linear down
-- to widths[s + 1]. The head is VibeNet's: Linear(w, 3w), GELU, Linear(3w, vocab).
local nn = require('anatomy.nn')
local models = require('anatomy.models')
local vibenet = require('anatomy.models.vibenet')

local Stage = nn.block('models.FunnelStage', function(self, width, count, next_width)
  self.blocks = nn.Repeat(count, function() return nn.Residual(models.VibeBlock(width, false)) end)
  if next_width then self.down = nn.Linear(width, next_width) end
end)
models.FunnelStage = Stage

-- stage(x) -> x at this stage's width: its attention and MLP, then the projection to the next width
function Stage:forward(x)
  x = self.blocks(x)
  if self.down then x = self.down(x) end
  return x
end

local Funnel = nn.block('models.Funnel', function(self, cfg)
  models.check_config('funnel', cfg, {'vocab', 'seq'}, {'widths', 'attentions'})
  local widths = cfg.widths or {512, 256, 128, 64}
  local attentions = cfg.attentions or {3, 4, 8, 16}
  if #widths ~= #attentions or #widths == 0 then
    error(('models.funnel: widths and attentions must be lists of equal length (got %d and %d)'):format(#widths, #attentions), 4)
  end
  rawset(self, 'config', {vocab = cfg.vocab, seq = cfg.seq, widths = widths, attentions = attentions})
  self.embed = nn.Embedding(cfg.vocab, widths[1], {positions = cfg.seq})
  self.stages = nn.Sequential()
  for s = 1, #widths do self.stages:add(Stage(widths[s], attentions[s], widths[s + 1])) end
  vibenet.vibe_head(self, widths[#widths], cfg.vocab)
end)
models.Funnel = Funnel

-- ids (B, T) int64, 1-based -> logits (B, T, V)
function Funnel:forward(ids)
  models.check_ids(self, ids)
  return self.head(self.act(self.expand(self.stages(self.embed(ids)))))
end

-- The head applied to a hidden state of the last stage's width: the logit lens.
function Funnel:readout(h)
  return self.head(self.act(self.expand(h)))
end

-- Every attention block of every stage, as {name, module} pairs.
function Funnel:layers()
  local out = {}
  for s, stage in self.stages:named_children() do
    for i, m in stage.blocks:named_children() do out[#out + 1] = {('stages.%s.blocks.%s'):format(s, i), m} end
  end
  return out
end

-- The funnel's settings as print(model) shows them: vocab, widths, attentions
function Funnel:extra_repr()
  return ('widths={%s}, attentions={%s}'):format(table.concat(self.config.widths, ', '), table.concat(self.config.attentions, ', '))
end

-- models.funnel{vocab, seq, widths, attentions} -> a Funnel: stages of decreasing width (funnel.lua's header)
local function new(cfg) return Funnel(cfg) end

return {new = new, Funnel = Funnel}
