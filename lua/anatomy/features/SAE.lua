-- sae.SAE: a sparse autoencoder over one point's activations, in SAELens's
-- layout. Features f = σ((x − b_dec) W_enc + b_enc), the reconstruction
-- x̂ = f W_dec + b_dec; W_enc (D, F), W_dec (F, D) with unit-norm rows (each
-- feature's direction in the model's space). σ by kind:
--   relu       ReLU (SAELens's 'standard'), sparse by an L1 penalty
--   topk       the k largest pre-activations of each row, then ReLU
--   jumprelu   pre where pre > threshold (a threshold per feature)
--   batchtopk  in training the k·N largest over a batch of N rows; afterwards
--              a JumpReLU at one threshold learnt in training (as SAELens
--              saves it)
-- A transcoder's decoder writes another point (d_out wide, d_in unless
-- cfg.d_out says); one with an affine skip (cfg.skip, SAELens's
-- skip_transcoder) adds x W_skipᵀ, W_skip (d_out, D), to the reconstruction.
-- D the point's width (d_in), F features (d_sae), N rows.
local torch = require('anatomy.torch')
local nn = require('anatomy.nn')
local format = require('anatomy.render.format')

local SAE = nn.class('sae.SAE', nn.Module)

SAE.kinds = {relu = true, topk = true, jumprelu = true, batchtopk = true}

-- SAE(cfg): cfg = {d_in, d_sae, kind, k, point, model_name,
-- apply_b_dec_to_input}, checked by sae.new. Decoder rows random unit
-- vectors, the encoder their transpose, biases zero, thresholds zero; on
-- device (default: torch.device()).
function SAE:__init(cfg, device)
  nn.Module.__init(self)
  self.cfg = cfg
  local D, F, D_out = cfg.d_in, cfg.d_sae, cfg.d_out or cfg.d_in
  local on = {device = device or torch.device()}
  local W_dec = torch.randn(F, D_out, on)
  W_dec = W_dec / W_dec:norm(2, -1, true)
  local W_enc = D_out == D and W_dec:t():contiguous() or torch.randn(D, F, on) / math.sqrt(D)
  self:register_parameter('W_enc', W_enc:requires_grad_(true))
  self:register_parameter('b_enc', torch.zeros(F, on):requires_grad_(true))
  self:register_parameter('W_dec', W_dec:requires_grad_(true))
  self:register_parameter('b_dec', torch.zeros(D_out, on):requires_grad_(true))
  if cfg.skip then self:register_parameter('W_skip', torch.zeros(D_out, D, on):requires_grad_(true)) end
  if cfg.kind == 'jumprelu' or cfg.kind == 'batchtopk' then
    local threshold = torch.full({F}, cfg.kind == 'jumprelu' and (cfg.threshold or 0.001) or 0, on)
    self:register_parameter('threshold', threshold:requires_grad_(cfg.kind == 'jumprelu'))
  end
end

-- s:pre(x) -> the pre-activations (..., F) of activations x (..., D)
function SAE:pre(x)
  local h = self.cfg.apply_b_dec_to_input and x - self.b_dec or x
  return h:matmul(self.W_enc) + self.b_enc
end

-- A JumpReLU's output, ReLU(pre) where pre > threshold; with a bandwidth, its
-- threshold learns through the straight-through estimate of the step's
-- derivative (a rectangle of that width around the threshold), and the
-- number of active features (the L0 that trains it) comes back too.
local function jump(pre, threshold, bandwidth)
  local on = pre:gt(threshold)
  local f = pre:relu():masked_fill(on:logical_not(), 0)  -- ReLU, then the jump (as SAELens: 0 below 0 whatever the threshold)
  if not bandwidth then return f end
  local near = ((pre - threshold):detach():abs():lt(bandwidth / 2)):float() / bandwidth  -- (..., F)
  -- forward: zero; backward: d f/d threshold = -threshold/ε on the rectangle, d L0/d threshold = -1/ε there
  local through_f = threshold * (threshold:detach() * near):detach()
  local through_l0 = threshold * near:detach()
  f = f - through_f + through_f:detach()
  local l0 = on:float() - through_l0 + through_l0:detach()
  return f, l0
end

-- The k largest of each row of pre (..., F), then ReLU; the rest zero.
local function topk(pre, k)
  local values, indices = pre:topk(k, -1)
  return torch.zeros_like(pre):scatter(-1, indices, values:relu())
end

-- The k·N largest of the N rows of pre (N, F) together, then ReLU, and the
-- smallest of those kept (the threshold that would have selected them).
local function batch_topk(pre, k)
  local flat = pre:relu():reshape({-1})
  local n = math.min(flat:numel(), k * pre:size(1))
  local values, indices = flat:topk(n)
  local out = torch.zeros_like(flat):scatter(1, indices, values)
  local positive = values:masked_select(values:gt(0))
  return out:view_as(pre), positive:numel() > 0 and positive:min():item() or 0
end

-- s:activate(pre, {training}) -> features f: σ of the pre-activations. In
-- training (opts.training), a JumpReLU also returns the L0 its threshold
-- learns from and a BatchTopK the threshold of the batch.
function SAE:activate(pre, training)
  local kind = self.cfg.kind
  if kind == 'relu' then return pre:relu() end
  if kind == 'topk' then return topk(pre, self.cfg.k) end
  if kind == 'jumprelu' then return jump(pre, self.threshold, training and self.cfg.bandwidth or nil) end
  if training then return batch_topk(pre:reshape({-1, pre:size(-1)}), self.cfg.k) end
  return jump(pre, self.threshold)
end

local function check_input(self, x, where)
  if not torch.is_tensor(x) then error(('%s: x must be a Tensor, got %s'):format(where, type(x)), 3) end
  if x:dim() < 1 or x:size(-1) ~= self.cfg.d_in then
    error(('%s: x must end in the SAE\'s d_in %d, got shape %s'):format(where, self.cfg.d_in, format.shape(x)), 3)
  end
  if not x:is_floating_point() then error(('%s: x must be floating point, got %s'):format(where, x.dtype), 3) end
end

-- s:encode(x) -> features (..., F) of activations x (..., D), in x's dtype
function SAE:encode(x)
  check_input(self, x, 'sae:encode')
  local dtype = x.dtype
  return (self:activate(self:pre(x:to(self.W_enc.dtype)))):to(dtype)
end

-- s:decode(f) -> the reconstruction (..., D) of features f (..., F)
function SAE:decode(f)
  if not torch.is_tensor(f) or f:dim() < 1 or f:size(-1) ~= self.cfg.d_sae then
    error(('sae:decode: f must be a Tensor ending in the SAE\'s d_sae %d, got %s'):format(self.cfg.d_sae,
      torch.is_tensor(f) and 'shape ' .. format.shape(f) or type(f)), 2)
  end
  local dtype = f.dtype
  return (f:to(self.W_dec.dtype):matmul(self.W_dec) + self.b_dec):to(dtype)
end

-- s:reconstruct(f, x) -> decode(f), plus x W_skipᵀ for a transcoder with
-- an affine skip (x the activations f was encoded from)
function SAE:reconstruct(f, x)
  local out = self:decode(f)
  if self.W_skip then out = out + x:to(self.W_skip.dtype):matmul(self.W_skip:t()):to(out.dtype) end
  return out
end

-- s(x) / s:forward(x) -> reconstruction, features
function SAE:forward(x)
  check_input(self, x, 'sae:forward')
  local f = self:encode(x)
  return self:reconstruct(f, x), f
end

-- s:normalize_decoder(): W_dec's rows scaled to unit norm (the encoder's
-- columns and b_enc keep the features' values: a row scaled by c has its
-- feature divided by c, so the SAE computes the same reconstruction)
function SAE:normalize_decoder()
  torch.no_grad(function()
    local norms = self.W_dec:norm(2, -1, true):clamp_min(1e-12)  -- (F, 1)
    self.W_dec:copy_(self.W_dec / norms)
    self.W_enc:copy_(self.W_enc * norms:t())
    self.b_enc:copy_(self.b_enc * norms:squeeze(2))
    if self.threshold and self.cfg.kind == 'jumprelu' then self.threshold:copy_(self.threshold * norms:squeeze(2)) end
  end)
end

-- s:remove_parallel_gradient(): W_dec's gradient less its component along
-- each row, so a step moves a feature's direction and not its norm
function SAE:remove_parallel_gradient()
  local g = self.W_dec.grad
  if not g then return end
  torch.no_grad(function()
    local along = (g * self.W_dec):sum(-1, true)  -- (F, 1)
    g:copy_(g - along * self.W_dec)
  end)
end

function SAE:__tostring()
  local c = self.cfg
  local k = (c.kind == 'topk' or c.kind == 'batchtopk') and (', k ' .. c.k) or ''
  local out = c.d_out and c.d_out ~= c.d_in and (' -> ' .. c.d_out) or ''
  return ('sae.SAE(%s%s, %d -> %d features%s%s%s)'):format(c.kind, k, c.d_in, c.d_sae, out,
    c.skip and ', affine skip' or '', c.point and (', at ' .. c.point) or '')
end

return SAE
