-- What sae.train_clt adds to sae.train's loop (features/train.lua): a fresh
-- sae.CLT from the first rows, and its losses. Every layer's MLP input x_l
-- and output y_l are one row (N, L, D); the loss, each layer in units of
-- its output's variance σ_l² (as sae.train's):
--   Σ_l ‖ŷ_l − y_l‖² / σ_l²                            reconstruction, summed over layers
--   + l0 · Σ_l Σ_i tanh(tanh_c · ‖W_dec_{l,i}‖ · f_{l,i} / σ)   jumprelu: the CLT paper's
--                                                     (Ameisen et al. 2025) sparsity penalty
--   + l1 · Σ_l Σ_i ‖W_dec_{l,i}‖ · f_{l,i} / σ          relu: the L1 weighted by decoder norm
--   + aux_coefficient · ‖ê − e‖² / σ²                  topk: the auxiliary-k loss
-- ‖W_dec_{l,i}‖ is the norm of everything feature i of layer l writes (its
-- decoder rows to every later layer, concatenated); σ² the mean of the σ_l².
-- Decoders are not held at unit norm: the penalties weigh each feature by
-- its decoder's norm, so shrinking a decoder does not buy sparsity.
local torch = require('anatomy.torch')
local CLT = require('anatomy.features.CLT')
local K = {}

-- K.build(o, D, model, shape) -> an untrained sae.CLT for the run's settings on the model's device
function K.build(o, D, model, shape)
  return CLT({n_layers = shape.n_layers, d_model = D, d_transcoder = o.width, kind = o.kind, k = o.k, cross_layer = shape.cross_layer,
    skip = shape.skip, input_hook = shape.input_hook, output_hook = shape.output_hook,
    model_name = model.config and model.config.name_or_path or nil}, model:device())
end

-- K.fresh(model, store, o, shape, sizes, where) -> c, x, y: a CLT for the
-- first rows: b_dec at each layer's output mean, the loss's scales σ_l², a
-- JumpReLU's threshold and bandwidth in the inputs' units.
function K.fresh(model, store, o, shape, sizes, where)
  local x, y = store:next(o.batch)
  local D = x:size(3)
  if y:size(3) ~= D then error(('%s: the MLP inputs are %d wide and their outputs %d'):format(where, D, y:size(3)), 0) end
  sizes(D)
  local c = K.build(o, D, model, shape)
  local mean = store.y:mean(1)  -- (L, D)
  local var = (store.y - mean):square():sum(-1):mean(1)  -- (L)
  local low = var:min():item()
  if not (low > 0) then
    local l = select(2, var:min(1)):item()
    error(('%s: the MLP output of layer %d does not vary (variance %s)'):format(where, l, tostring(low)), 0)
  end
  torch.no_grad(function() c.b_dec:copy_(mean) end)
  if o.kind == 'jumprelu' then
    local var_in = (store.x - store.x:mean(1)):square():sum(-1):mean():item()
    c.cfg.bandwidth = o.bandwidth * math.sqrt(var_in / D)
    torch.no_grad(function() c.threshold:fill_(c.cfg.bandwidth) end)
  end
  c.cfg.variance = var
  return c, x, y
end

-- The norm of all that each feature writes: (L, F).
local function decoder_norms(c)
  local out = {}
  for l = 1, c.cfg.n_layers do
    local W = c:decoder(l)
    out[l] = W:reshape({W:size(1), -1}):norm(2, -1)
  end
  return torch.stack(out, 1)
end

-- K.losses(c, o, x, y, var, dead) -> total, mse (the mean over layers, for
-- explained variance), f, recon, extra
function K.losses(c, o, x, y, var, dead)
  local pre = c:pre(x)
  local f, extra = c:activate(pre, true)
  local recon = c:_decode(f, x)
  local per_layer = (recon - y):square():sum(-1):mean(1) / var  -- (L)
  local total = per_layer:sum()
  local sigma = math.sqrt(var:mean():item())
  if o.kind == 'relu' then
    total = total + o.l1 * (f * decoder_norms(c)):sum({-2, -1}):mean() / sigma
  elseif o.kind == 'jumprelu' then
    total = total + o.l0 * (f * decoder_norms(c) * (o.tanh_c / sigma)):tanh():sum({-2, -1}):mean()
  else
    local n_dead = dead:sum():item()
    if n_dead > 0 and o.aux_coefficient > 0 then
      -- each layer's k_aux largest pre-activations among its dead features
      local k = math.min(o.k_aux, c.cfg.d_transcoder)
      local masked = pre:masked_fill(dead:logical_not(), -math.huge)
      local values, indices = masked:topk(k, -1)
      local fa = torch.zeros_like(pre):scatter(-1, indices, values:relu())
      local e = (y - recon):detach()
      local aux = (c:_decode(fa, nil, true) - e):square():sum(-1):mean(1) / var
      total = total + o.aux_coefficient * aux:sum()
    end
  end
  return total, per_layer:mean(), f, recon, extra
end

return K
