-- optim: LibTorch's AdamW over a module's parameters, and learning-rate
-- schedules. The state (moments and step counts) can be read and restored,
-- for checkpoints that resume exactly.
local optim = {}

local AdamW = {}
AdamW.__index = AdamW
optim.AdamW = AdamW

local allowed = {lr = true, betas = true, eps = true, weight_decay = true, decay = true}

-- optim.AdamW(model_or_params, {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8,
--   weight_decay = 0.01, decay = 'all'|'matrices'})
-- decay = 'matrices' applies weight decay only to parameters of 2 or more
-- dimensions (not to biases, norms and gains), as nanoGPT does.
setmetatable(AdamW, {__call = function(_, params, opts)
  opts = require('anatomy.options').check(opts, allowed, 'optim.AdamW', 2)
  local list = nn.is_module(params) and params:parameters() or params
  if type(list) ~= 'table' then error('optim.AdamW: expected a module or a table of parameters', 2) end
  local decayed, plain = {}, {}
  for _, p in ipairs(list) do
    if opts.decay == 'matrices' and p:dim() < 2 then plain[#plain + 1] = p else decayed[#decayed + 1] = p end
  end
  local self = setmetatable({params = {}}, AdamW)
  for _, p in ipairs(decayed) do self.params[#self.params + 1] = p end
  for _, p in ipairs(plain) do self.params[#self.params + 1] = p end
  self._native = torch._optim.AdamW(decayed, plain, {lr = opts.lr, betas = opts.betas, eps = opts.eps,
    weight_decay = opts.weight_decay})
  return self
end})

function AdamW:step() self._native:step() end
function AdamW:zero_grad() self._native:zero_grad() end
function AdamW:set_lr(lr) self._native:set_lr(lr) end
function AdamW:lr() return self._native:lr() end

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

-- optim.schedule(kind, lr, steps, warmup) -> function(step) -> learning rate.
-- 'cosine': linear warmup, then cosine decay to lr/10; 'constant': warmup, then lr.
function optim.schedule(kind, lr, steps, warmup)
  warmup = warmup or 0
  if kind ~= 'cosine' and kind ~= 'constant' then
    error(("schedule must be 'cosine' or 'constant', got '%s'"):format(tostring(kind)), 2)
  end
  return function(step)
    if step <= warmup then return lr * step / math.max(warmup, 1) end
    if kind == 'constant' then return lr end
    local progress = (step - warmup) / math.max(steps - warmup, 1)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * math.min(progress, 1))))
  end
end

-- optim.clip_grad_norm(params, max_norm) -> the total gradient norm before
-- clipping (one read back, not one per parameter); when max_norm is a positive
-- number and the norm exceeds it, every gradient is scaled down to it
-- (PyTorch's torch.nn.utils.clip_grad_norm_). train.fit clips with it.
function optim.clip_grad_norm(params, max_norm)
  local norms = {}
  for _, p in ipairs(params) do if p.grad ~= nil then norms[#norms + 1] = p.grad:norm() end end
  if #norms == 0 then return 0 end
  local total = torch.stack(norms):norm():item()
  if max_norm and max_norm > 0 and total > max_norm then
    local scale = max_norm / (total + 1e-6)
    torch.no_grad(function() for _, p in ipairs(params) do if p.grad ~= nil then p.grad:mul_(scale) end end end)
  end
  return total
end

return optim
