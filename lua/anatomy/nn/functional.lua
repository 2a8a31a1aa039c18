-- nn.functional: stateless functions over tensors, with PyTorch's names and
-- arguments (torch.nn.functional), composed from LibTorch's tensor ops.
-- Dimensions and ids are 1-based, as everywhere in anatomy.
local torch = require('anatomy.torch')
local native = require('anatomy.torch.native')
local nn = require('anatomy.nn')
local options = require('anatomy.torch.options')

local F = {}
nn.functional = F

local function check_tensor(v, arg, fname)
  if not torch.is_tensor(v) then
    error(("bad argument #%d to '%s' (Tensor expected, got %s)"):format(arg, fname, nn.typename(v)), 3)
  end
end

local reductions = {none = 0, mean = 1, sum = 2}

local function check_reduction(r, fname)
  if r == nil then return 'mean' end
  if reductions[r] == nil then
    error(("bad argument #3 to '%s' (reduction must be 'mean', 'sum' or 'none', got %s)"):format(fname,
      type(r) == 'string' and ("'" .. r .. "'") or tostring(r)), 3)
  end
  return r
end

-- cross_entropy(logits (..., V), targets (...) int64 class ids, 1-based,
-- {reduction = 'mean'|'sum'|'none', ignore_index, label_smoothing = 0,
-- weight (V)}) -> the loss, as torch.nn.functional.cross_entropy with the
-- classes last: 'none' gives one loss a target (targets' shape); 'mean'
-- averages over the targets not ignored (weighted by their class's weight
-- where weight is given); ignore_index is a target value whose positions
-- count for nothing (it need not be a class id: 0 or -100 work).
function F.cross_entropy(logits, targets, opts)
  check_tensor(logits, 1, 'cross_entropy')
  check_tensor(targets, 2, 'cross_entropy')
  opts = options.check(opts, {'reduction', 'ignore_index', 'label_smoothing', 'weight'}, 'cross_entropy', 2)
  local reduction = check_reduction(opts.reduction, 'cross_entropy')
  local ii, ls, w = opts.ignore_index, opts.label_smoothing, opts.weight
  if ii ~= nil and (type(ii) ~= 'number' or ii % 1 ~= 0) then
    error(("bad argument #3 to 'cross_entropy' (ignore_index must be a whole number, got %s)"):format(tostring(ii)), 2)
  end
  if ls ~= nil and (type(ls) ~= 'number' or not (ls >= 0 and ls <= 1)) then
    error(("bad argument #3 to 'cross_entropy' (label_smoothing must be in [0, 1], got %s)"):format(tostring(ls)), 2)
  end
  if w ~= nil and not torch.is_tensor(w) then
    error(("bad argument #3 to 'cross_entropy' (weight must be a Tensor (V), got %s)"):format(nn.typename(w)), 2)
  end
  return native.cross_entropy(logits, targets, reductions[reduction], ii, ls or 0, w)
end

-- mse_loss(input, target, {reduction = 'mean'|'sum'|'none'})
function F.mse_loss(input, target, opts)
  check_tensor(input, 1, 'mse_loss')
  check_tensor(target, 2, 'mse_loss')
  opts = options.check(opts, {'reduction'}, 'mse_loss', 2)
  local reduction = check_reduction(opts.reduction, 'mse_loss')
  local d = (input - target) ^ 2
  if reduction == 'mean' then return d:mean() end
  if reduction == 'sum' then return d:sum() end
  return d
end

-- gelu(x, approximate = 'none'|'tanh')
function F.gelu(x, approximate) return x:gelu(approximate) end
-- relu(x)
function F.relu(x) return x:relu() end
-- silu(x) = x * sigmoid(x)
function F.silu(x) return x:silu() end
-- softplus(x, beta = 1, threshold = 20)
function F.softplus(x, beta, threshold) return x:softplus(beta, threshold) end
-- softmax(x, dim)
function F.softmax(x, dim) return x:softmax(dim) end
-- log_softmax(x, dim)
function F.log_softmax(x, dim) return x:log_softmax(dim) end

-- linear(x, weight [out, in], bias [out] or nil) -> x Wᵀ + b
function F.linear(x, weight, bias)
  check_tensor(x, 1, 'linear')
  check_tensor(weight, 2, 'linear')
  local y = x:matmul(weight:t())
  if bias ~= nil then y = y + bias end
  return y
end

-- embedding(ids int64, 1-based, weight [n, dim]) -> (..., dim)
function F.embedding(ids, weight)
  check_tensor(ids, 1, 'embedding')
  check_tensor(weight, 2, 'embedding')
  local flat = weight:index_select(1, ids:reshape(-1))
  local shape = ids:size()
  shape[#shape + 1] = weight:size(2)
  return flat:reshape(shape)
end

-- the last #normalized_shape dimensions, as negative (from the end) dims;
-- normalized_shape must be x's trailing sizes (PyTorch's check), eps a
-- positive number, weight and bias tensors of normalized_shape
local function last_dims(x, normalized_shape, fname, eps, weight, bias, eps_arg)
  check_tensor(x, 1, fname)
  local shape = type(normalized_shape) == 'number' and {normalized_shape} or normalized_shape
  if type(shape) ~= 'table' or #shape == 0 or #shape > x:dim() then
    error(("bad argument #2 to '%s' (normalized_shape must be a size or a list of x's trailing sizes, got %s)"):format(fname,
      tostring(normalized_shape)), 3)
  end
  local sizes = x:size()
  for i = 1, #shape do
    if shape[i] ~= sizes[#sizes - #shape + i] then
      error(("bad argument #2 to '%s' (normalized_shape %s does not match x's trailing sizes %s)"):format(fname,
        table.concat(shape, 'x'), table.concat(sizes, 'x', #sizes - #shape + 1)), 3)
    end
  end
  if eps ~= nil and (type(eps) ~= 'number' or not (eps > 0)) then
    error(("bad argument #%d to '%s' (eps must be a positive number, got %s)"):format(eps_arg or 5, fname, tostring(eps)), 3)
  end
  for _, t in ipairs{{weight, 'weight'}, {bias, 'bias'}} do
    if t[1] ~= nil then
      if not torch.is_tensor(t[1]) then
        error(("bad argument to '%s' (%s must be a Tensor, got %s)"):format(fname, t[2], nn.typename(t[1])), 3)
      end
      if table.concat(t[1]:size(), 'x') ~= table.concat(shape, 'x') then
        error(("bad argument to '%s' (%s has shape %s, normalized_shape is %s)"):format(fname, t[2], table.concat(t[1]:size(), 'x'),
          table.concat(shape, 'x')), 3)
      end
    end
  end
  local dims = {}
  for i = 1, #shape do dims[i] = -i end
  return dims
end

-- layer_norm(x, normalized_shape, weight, bias, eps = 1e-5)
function F.layer_norm(x, normalized_shape, weight, bias, eps)
  local dims = last_dims(x, normalized_shape, 'layer_norm', eps, weight, bias)
  local mean = x:mean({dim = dims, keepdim = true})
  local centered = x - mean
  local var = (centered * centered):mean({dim = dims, keepdim = true})
  local y = centered / (var + (eps or 1e-5)):sqrt()
  if weight ~= nil then y = y * weight end
  if bias ~= nil then y = y + bias end
  return y
end

-- rms_norm(x, normalized_shape, weight, eps = 1e-6): x / √(mean(x²) + eps) · weight
function F.rms_norm(x, normalized_shape, weight, eps)
  local dims = last_dims(x, normalized_shape, 'rms_norm', eps, weight, nil, 4)
  local y = x / ((x * x):mean({dim = dims, keepdim = true}) + (eps or 1e-6)):sqrt()
  if weight ~= nil then y = y * weight end
  return y
end

-- dropout(x, p = 0.5, training = true): zeroes elements with probability p and
-- scales the rest by 1/(1-p) (the mask comes from torch's generator)
function F.dropout(x, p, training)
  check_tensor(x, 1, 'dropout')
  p = p or 0.5
  if type(p) ~= 'number' or not (p >= 0 and p < 1) then error(("bad argument #2 to 'dropout' (p must be in [0, 1), got %s)"):format(tostring(p)), 2) end
  if training ~= nil and type(training) ~= 'boolean' then
    error(("bad argument #3 to 'dropout' (training must be true or false, got %s)"):format(tostring(training)), 2)
  end
  if training == false or p == 0 then return x end
  local keep = torch.rand_like(x):ge(p):to(x.dtype)
  return x * keep / (1 - p)
end

-- scaled_dot_product_attention(q, k, v, {attn_mask, is_causal = false, scale})
-- q (..., T, D), k (..., S, D), v (..., S, Dv): softmax(q kᵀ · scale + mask) v,
-- scale 1/√D by default; attn_mask a bool tensor (true: may attend) or an additive float one.
function F.scaled_dot_product_attention(q, k, v, opts)
  check_tensor(q, 1, 'scaled_dot_product_attention')
  check_tensor(k, 2, 'scaled_dot_product_attention')
  check_tensor(v, 3, 'scaled_dot_product_attention')
  opts = options.check(opts, {attn_mask = true, is_causal = true, scale = true}, 'scaled_dot_product_attention', 2)
  local scale = opts.scale or 1 / math.sqrt(q:size(-1))
  local scores = q:matmul(k:transpose(-2, -1)) * scale                 -- (..., T, S)
  if opts.is_causal then
    local T, S = q:size(-2), k:size(-2)
    scores = scores:masked_fill(torch.ones(T, S, {dtype = 'bool', device = scores.device}):triu(1), -math.huge)
  end
  local mask = opts.attn_mask
  if mask ~= nil then
    if mask.dtype == 'bool' then scores = scores:masked_fill(mask:logical_not(), -math.huge)
    else scores = scores + mask end
  end
  return scores:softmax(-1):matmul(v)
end

return F
