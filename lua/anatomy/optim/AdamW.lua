-- optim.AdamW: LibTorch's AdamW (host/optim/adamw.cpp) over a module's
-- parameters, in two groups (with and without weight decay). Its state
-- (moments and step counts) can be read and restored, for checkpoints that
-- resume exactly.
local torch = require('anatomy.torch')
local native = require('anatomy.torch.native')
local options = require('anatomy.torch.options')
local Optimizer = require('anatomy.optim.Optimizer')
local AdamW = {}
AdamW.__index = AdamW

local allowed = {lr = true, betas = true, eps = true, weight_decay = true, decay = true}

-- optim.AdamW(model_or_params, {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8,
--   weight_decay = 0.01, decay = 'all'|'matrices'})
-- decay = 'matrices' applies weight decay only to parameters of 2 or more
-- dimensions (not to biases, norms and gains), as nanoGPT does.
setmetatable(AdamW, {__call = function(_, params, opts)
  opts = options.check(opts, allowed, 'optim.AdamW', 2)
  local list = Optimizer.params(params, 'optim.AdamW', 2)
  local decayed, plain = {}, {}
  for _, p in ipairs(list) do
    if opts.decay == 'matrices' and p:dim() < 2 then plain[#plain + 1] = p else decayed[#decayed + 1] = p end
  end
  local self = setmetatable({params = {}}, AdamW)
  for _, p in ipairs(decayed) do self.params[#self.params + 1] = p end
  for _, p in ipairs(plain) do self.params[#self.params + 1] = p end
  self._native = native.optim.AdamW(decayed, plain, {lr = opts.lr, betas = opts.betas, eps = opts.eps,
    weight_decay = opts.weight_decay})
  return self
end})

-- opt:step(): one AdamW update of every parameter from its gradient
function AdamW:step() self._native:step() end
-- opt:zero_grad(): clears the parameters' gradients
function AdamW:zero_grad() self._native:zero_grad() end
-- opt:set_lr(lr): the learning rate from the next step on
function AdamW:set_lr(lr) self._native:set_lr(lr) end
-- opt:lr() -> the learning rate in use
function AdamW:lr() return self._native:lr() end
-- opt:set_capturable(true|false): PyTorch's `capturable`: the step count and
-- the learning rate live in tensors on the parameters' device and a step reads
-- nothing back, so that a CUDA graph can record it (train.fit's cuda_graph).
-- The same update up to rounding; one step count for all parameters.
function AdamW:set_capturable(on) self._native:set_capturable(on) end

-- opt:state_tensors(prefix) -> {prefix .. i .. '.exp_avg' = t, ...}: the state as named tensors
function AdamW:state_tensors(prefix)
  prefix = prefix or 'optim.'
  local out = {}
  for i, s in ipairs(self._native:state()) do
    if s then
      out[prefix .. i .. '.exp_avg'] = s.exp_avg
      out[prefix .. i .. '.exp_avg_sq'] = s.exp_avg_sq
      out[prefix .. i .. '.step'] = torch.tensor(s.step, {dtype = 'int64'})
    end
  end
  return out
end

-- opt:load_state_tensors(t, prefix): the inverse of state_tensors
function AdamW:load_state_tensors(t, prefix)
  prefix = prefix or 'optim.'
  local state = {}
  for i = 1, #self.params do
    local m = t[prefix .. i .. '.exp_avg']
    if m then
      state[i] = {exp_avg = m, exp_avg_sq = t[prefix .. i .. '.exp_avg_sq'], step = t[prefix .. i .. '.step']:item()}
    else
      state[i] = false
    end
  end
  self._native:load_state(state)
end

return AdamW
