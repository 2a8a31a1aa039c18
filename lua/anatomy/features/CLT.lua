-- sae.CLT: a cross-layer transcoder, as circuit-tracer 0.5.0 defines it (its
-- CrossLayerTranscoder), and a set of per-layer transcoders (its
-- TranscoderSet) as the same object with cross_layer = false. Layer l's
-- features read that layer's MLP input x_l; they write to the MLP outputs of
-- every layer m ≥ l (a set: only to layer l's own):
--   pre_l = x_l W_enc[l]ᵀ + b_enc[l]               (F)
--   f_l   = σ(pre_l)                                relu, jumprelu (pre · [pre > θ_l]), topk
--   ŷ_m   = b_dec[m] + Σ_{l ≤ m} f_l W_dec_l[:, m − l] (+ W_skip[m] x_m, a set's skip)
-- Shapes as circuit-tracer's: W_enc (L, F, D), b_enc (L, F), b_dec (L, D),
-- threshold (L, F), W_dec_{l-1} (F, L − l + 1, D) (a set's (F, 1, D)),
-- W_skip (L, D, D) with skip = x W_skip[m]ᵀ (a set's; circuit-tracer's CLT
-- files have none). Layers count from 1 here, from 0 in the files' names.
-- L layers, D the model's width (d_model), F features per layer (d_transcoder).
local torch = require('anatomy.torch')
local nn = require('anatomy.nn')
local format = require('anatomy.render.format')
local files = require('anatomy.features.clt_files')

local CLT = nn.class('sae.CLT', nn.Module)

CLT.kinds = {relu = true, jumprelu = true, topk = true}

-- CLT(cfg, device): cfg = {n_layers, d_model, d_transcoder, kind, k,
-- cross_layer, skip, input_hook, output_hook, model_name}, checked by
-- sae.clt. Weights as Anthropic's CLT paper starts them: W_enc uniform in
-- ±1/√D, each decoder in ±1/√(L·D), biases and thresholds zero (a
-- JumpReLU's threshold cfg.threshold).
function CLT:__init(cfg, device)
  nn.Module.__init(self)
  self.cfg = cfg
  local L, D, F = cfg.n_layers, cfg.d_model, cfg.d_transcoder
  local on = {device = device or torch.device()}
  local function uniform(shape, bound) return (torch.rand(shape, on) * 2 - 1) * bound end
  self:register_parameter('W_enc', uniform({L, F, D}, 1 / math.sqrt(D)):requires_grad_(true))
  self:register_parameter('b_enc', torch.zeros(L, F, on):requires_grad_(true))
  self:register_parameter('b_dec', torch.zeros(L, D, on):requires_grad_(true))
  for l = 1, L do
    local width = cfg.cross_layer and L - l + 1 or 1
    self:register_parameter('W_dec_' .. (l - 1), uniform({F, width, D}, 1 / math.sqrt(L * D)):requires_grad_(true))
  end
  if cfg.kind == 'jumprelu' then
    self:register_parameter('threshold', torch.full({L, F}, cfg.threshold or 0, on):requires_grad_(true))
  end
  if cfg.skip then self:register_parameter('W_skip', torch.zeros(L, D, D, on):requires_grad_(true)) end
end

-- c:decoder(l) -> layer l's decoder (F, L − l + 1, D): row f, slice j is
-- what feature f of layer l writes to layer l + j − 1 (a set's (F, 1, D))
function CLT:decoder(l)
  return self['W_dec_' .. (l - 1)]
end

local function check_layered(self, x, where, name, width, level)
  local L = self.cfg.n_layers
  if not torch.is_tensor(x) then error(('%s: %s must be a Tensor, got %s'):format(where, name, type(x)), level + 1) end
  if x:dim() < 2 or x:size(-2) ~= L or x:size(-1) ~= width then
    error(("%s: %s must end in (n_layers, %s) = (%d, %d), got shape %s"):format(where, name, name == 'x' and 'd_model' or
      'd_transcoder', L, width, format.shape(x)), level + 1)
  end
  if not x:is_floating_point() then error(('%s: %s must be floating point, got %s'):format(where, name, x.dtype), level + 1) end
end

-- c:pre(x) -> the pre-activations (..., L, F) of the MLP inputs x (..., L, D)
function CLT:pre(x)
  local pre = x:unsqueeze(-2):matmul(self.W_enc:transpose(-1, -2)):squeeze(-2)  -- (..., L, 1, D) @ (L, D, F)
  return pre + self.b_enc
end

-- A JumpReLU's output, pre · [pre > θ] (circuit-tracer's: a negative
-- threshold lets negative values through). With a bandwidth ε, the
-- threshold learns through the straight-through estimate of the step
-- (circuit-tracer's backward: −θ/ε on a rectangle of width ε around θ), and
-- the L0 that trains it comes back with the same estimate (−1/ε there).
local function jump(pre, threshold, bandwidth)
  local on = pre:gt(threshold)
  local f = pre * on:to(pre.dtype)
  if not bandwidth then return f end
  local near = (pre - threshold):detach():abs():lt(bandwidth / 2):to(pre.dtype) / bandwidth
  local through_f = threshold * (threshold:detach() * near):detach()
  local through_l0 = threshold * near:detach()
  return f - through_f + through_f:detach(), on:to(pre.dtype) - through_l0 + through_l0:detach()
end

local function activation(self, pre, threshold, training)
  local kind = self.cfg.kind
  if kind == 'relu' then return pre:relu() end
  if kind == 'jumprelu' then return jump(pre, threshold, training and self.cfg.bandwidth or nil) end
  local values, indices = pre:topk(self.cfg.k, -1)  -- each layer's k largest, then ReLU
  return torch.zeros_like(pre):scatter(-1, indices, values:relu())
end

-- c:activate(pre[, training]) -> features (..., L, F); in training a
-- JumpReLU also gives the L0 its threshold learns from.
function CLT:activate(pre, training)
  return activation(self, pre, self.threshold, training)
end

-- c:encode_layer(x, l) -> layer l's features (..., F) of its MLP input x
-- (..., D), in the transcoders' dtype (what a splice computes as the
-- forward reaches layer l)
function CLT:encode_layer(x, l)
  local pre = x:to(self.W_enc.dtype):matmul(self.W_enc:select(1, l):t()) + self.b_enc:select(1, l)
  return (activation(self, pre, self.threshold and self.threshold:select(1, l)))
end

-- c:decode_layer(fs, m[, x]) -> layer m's reconstruction (..., D) from the
-- features fs[1..m] of layers 1..m (each (..., F)) and, with a skip, layer
-- m's input x
function CLT:decode_layer(fs, m, x)
  local recon = self.b_dec:select(1, m)
  for l = 1, m do
    local W = self:decoder(l)
    if m - l < W:size(2) then recon = recon + fs[l]:matmul(W:select(2, m - l + 1)) end  -- (F, D): layer l to layer m
  end
  if self.W_skip then recon = recon + x:matmul(self.W_skip:select(1, m):t()) end
  return recon
end

-- c:encode(x) -> features (..., L, F) of the MLP inputs x (..., L, D), in x's dtype
function CLT:encode(x)
  check_layered(self, x, 'clt:encode', 'x', self.cfg.d_model, 2)
  local dtype = x.dtype
  local f = self:activate(self:pre(x:to(self.W_enc.dtype)))
  return f:to(dtype)
end

-- The reconstruction (..., L, D) from features f (..., L, F); x (..., L, D)
-- the MLP inputs, which a skip reads (nil without one). bare: the features'
-- part alone, without b_dec and the skip (the auxiliary loss's).
function CLT:_decode(f, x, bare)
  local L, D = self.cfg.n_layers, self.cfg.d_model
  local recon
  for l = 1, L do
    local W = self:decoder(l)
    local width = W:size(2)
    local out = f:select(-2, l):matmul(W:reshape({W:size(1), width * D}))  -- (..., width·D)
    local shape = out:size()
    shape[#shape] = width
    shape[#shape + 1] = D
    out = out:reshape(shape)  -- (..., width, D): what layer l writes to layers l .. l + width - 1
    local pieces = {}
    if l > 1 then
      local s = out:size(); s[#s - 1] = l - 1
      pieces[#pieces + 1] = torch.zeros(s, {dtype = out.dtype, device = out.device})
    end
    pieces[#pieces + 1] = out
    if l - 1 + width < L then
      local s = out:size(); s[#s - 1] = L - (l - 1) - width
      pieces[#pieces + 1] = torch.zeros(s, {dtype = out.dtype, device = out.device})
    end
    local placed = #pieces == 1 and out or torch.cat(pieces, -2)
    recon = recon and recon + placed or placed
  end
  if bare then return recon end
  recon = recon + self.b_dec
  if self.W_skip then
    recon = recon + x:unsqueeze(-2):matmul(self.W_skip:transpose(-1, -2)):squeeze(-2)  -- x_m W_skip[m]ᵀ
  end
  return recon
end

-- c:decode(f[, x]) -> the reconstructions (..., L, D) of every layer's MLP
-- output from features f (..., L, F), in f's dtype; x, the MLP inputs, is
-- needed where the transcoders have a skip (W_skip)
function CLT:decode(f, x)
  check_layered(self, f, 'clt:decode', 'f', self.cfg.d_transcoder, 2)
  if self.W_skip then
    if x == nil then error('clt:decode: these transcoders have a skip (W_skip): give the MLP inputs x too', 2) end
    check_layered(self, x, 'clt:decode', 'x', self.cfg.d_model, 2)
  end
  local dtype = f.dtype
  local out = self:_decode(f:to(self.W_enc.dtype), x and x:to(self.W_enc.dtype))
  return out:to(dtype)
end

-- c(x) / c:forward(x) -> reconstructions (..., L, D), features (..., L, F)
function CLT:forward(x)
  local f = self:encode(x)
  return self:decode(f, x), f
end

-- c:save(folder) -> folder: the transcoders in circuit-tracer's layout
-- (W_enc_{i} and W_dec_{i} files for a CLT, layer_{i} for a set, and
-- config.yaml), which circuit-tracer's load_clt and load_transcoder_set
-- read; float32. A TopK has no form there: an error.
function CLT:save(folder)
  if type(folder) ~= 'string' or folder == '' then error(('clt:save: folder must be a string, got %s'):format(tostring(folder)), 2) end
  local ok, err = pcall(files.write, self, folder, 'clt:save')
  if not ok then error(err, 2) end
  return folder
end

function CLT:__tostring()
  local c = self.cfg
  return ('sae.CLT(%s%s, %d layers, %d -> %d features a layer%s%s)'):format(c.kind, c.kind == 'topk' and (', k ' .. c.k) or '',
    c.n_layers, c.d_model, c.d_transcoder, c.cross_layer and ', cross-layer' or ', per-layer', c.skip and ', skip' or '')
end

return CLT
