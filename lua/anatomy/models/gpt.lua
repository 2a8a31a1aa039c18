-- models.gpt{vocab, dim, heads, layers, seq, ffn, residual = true, norm = 'post'|'pre', activation = 'relu'}
-- The standard character transformer. Each block has attention and an MLP
-- (dim -> ffn -> dim), with LayerNorm; norm = 'post' is the default:
--   post  x = ln1(x + attn(x)); x = ln2(x + mlp(x)), no final norm   (residual = false drops both adds)
--   pre   x = x + attn(ln1(x)); x = x + mlp(ln2(x)); a final ln_f before the head (GPT-2's layout: what
--         direct logit attribution, edge attribution and weight processing need)
-- With layers = 1, dim = 64, heads = 2, ffn = 128, norm = 'post' it is the
-- one-layer model of the residual-ablation experiment.
local nn = require('anatomy.nn')
local models = require('anatomy.models')

local GPTBlock = nn.block('models.GPTBlock', function(self, cfg)
  rawset(self, 'residual', cfg.residual ~= false)
  rawset(self, 'pre', cfg.norm == 'pre')
  self.attn = nn.Attention(cfg.dim, cfg.heads, {causal = true})
  self.ln1 = nn.LayerNorm(cfg.dim)
  self.mlp = nn.MLP(cfg.dim, cfg.ffn, {activation = cfg.activation or 'relu'})
  self.ln2 = nn.LayerNorm(cfg.dim)
end)
models.GPTBlock = GPTBlock

-- Hook points: resid_pre (what the block reads), resid_mid (the stream
-- between attention and MLP), resid_post (what it writes).
GPTBlock.hook_names = {'resid_pre', 'resid_mid', 'resid_post'}

-- block(x) -> x with attention and MLP added (pre- or post-norm, residual or not as configured),
-- publishing resid_pre, resid_mid and resid_post
function GPTBlock:forward(x)
  x = self:hook('resid_pre', x)
  if self.pre then
    if self.residual then
      x = self:hook('resid_mid', x + self.attn(self.ln1(x)))
      return self:hook('resid_post', x + self.mlp(self.ln2(x)))
    end
    return self:hook('resid_post', self.mlp(self.ln2(self:hook('resid_mid', self.attn(self.ln1(x))))))
  end
  if self.residual then
    x = self:hook('resid_mid', self.ln1(x + self.attn(x)))
    return self:hook('resid_post', self.ln2(x + self.mlp(x)))
  end
  return self:hook('resid_post', self.ln2(self.mlp(self:hook('resid_mid', self.ln1(self.attn(x))))))
end

-- The block's residual and norm placement as print(model) shows them
function GPTBlock:extra_repr()
  return ('%s-norm%s'):format(self.pre and 'pre' or 'post', self.residual and '' or ', no residual')
end

local GPT = nn.block('models.GPT', function(self, cfg)
  models.check_config('gpt', cfg, {'vocab', 'dim', 'heads', 'layers', 'seq', 'ffn'}, {'residual', 'norm', 'activation'})
  local norm = cfg.norm or 'post'
  if norm ~= 'post' and norm ~= 'pre' then
    error(("models.gpt: norm must be 'post' or 'pre', got '%s'"):format(tostring(norm)), 4)
  end
  rawset(self, 'config', cfg)
  self.embed = nn.Embedding(cfg.vocab, cfg.dim, {positions = cfg.seq})
  self.blocks = nn.Repeat(cfg.layers, function() return GPTBlock(cfg) end)
  if norm == 'pre' then
    self.ln_f = nn.LayerNorm(cfg.dim)
    rawset(self, 'final_norm', 'ln_f')  -- TransformerLens's ln_final
  end
  self.head = nn.Linear(cfg.dim, cfg.vocab)
end)
models.GPT = GPT
-- cached generation: the attention keeps its keys and values, the embedding counts the positions
GPT.incremental = true

-- ids (B, T) int64, 1-based -> logits (B, T, V)
function GPT:forward(ids)
  models.check_ids(self, ids)
  local x = self.blocks(self.embed(ids))
  if self.ln_f then x = self.ln_f(x) end
  return self.head(x)
end

-- model:processing_names() -> the children models.process_weights folds
-- and centres ({embed, stack, norm, head}), or nil and why: a post-norm
-- block's norms read the sums, not the attention's and MLP's inputs, so
-- there is nothing to fold them into.
function GPT:processing_names()
  if not self.ln_f then
    return nil, "a post-norm models.gpt (its norms read the residual sums, not the attention's and MLP's inputs) has no "
      .. "weights to fold them into; build it with norm = 'pre'"
  end
  return {embed = 'embed', stack = 'blocks', norm = 'ln_f', head = 'head'}
end

-- The head applied to a hidden state (B, T, C): the logit lens.
function GPT:readout(h)
  if self.ln_f then h = self.ln_f(h) end
  return self.head(h)
end

-- model:unembedding() -> the head's weight (V x C)
function GPT:unembedding() return self.head.weight end

-- The model's settings as print(model) shows them: vocab, dim, heads, layers, seq, ffn
function GPT:extra_repr()
  local c = self.config
  return ('vocab=%d, dim=%d, heads=%d, layers=%d, seq=%d, ffn=%d'):format(c.vocab, c.dim, c.heads, c.layers, c.seq, c.ffn)
end

-- models.gpt{vocab, dim, heads, layers, seq, ffn, residual = true, norm = 'pre'|'post', activation} -> a GPT
-- (token and position embedding, `layers` GPTBlocks, a final norm and the head)
local function new(cfg) return GPT(cfg) end

return {new = new, GPT = GPT}
