-- optim: optimizers over a module's parameters (LibTorch's AdamW; SGD and
-- Adam written with tensor ops, as PyTorch defines them), learning-rate
-- schedules usable inside train.fit and outside it, and gradient clipping.
local torch = require('anatomy.torch')
local optim = {}
package.loaded['anatomy.optim'] = optim  -- the files below require it while it loads

optim.AdamW = require 'anatomy.optim.AdamW'
optim.SGD = require 'anatomy.optim.SGD'
optim.Adam = require 'anatomy.optim.Adam'

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

-- optim.clip_grad_norm_(params, max_norm) -> the total gradient norm before
-- clipping, as a tensor (nothing is read back to the host); when max_norm is a
-- positive number every gradient is multiplied by min(1, max_norm / (norm +
-- 1e-6)), as PyTorch's torch.nn.utils.clip_grad_norm_ does.
function optim.clip_grad_norm_(params, max_norm)
  local norms = {}
  for _, p in ipairs(params) do if p.grad ~= nil then norms[#norms + 1] = p.grad:norm() end end
  if #norms == 0 then return torch.zeros({}) end
  local total = torch.stack(norms):norm()
  if max_norm and max_norm > 0 then
    torch.no_grad(function()
      local coef = (max_norm / (total + 1e-6)):clamp_max(1)
      for _, p in ipairs(params) do if p.grad ~= nil then p.grad:mul_(coef) end end
    end)
  end
  return total
end

-- optim.clip_grad_norm(params, max_norm) -> the same norm as a number (one read back).
function optim.clip_grad_norm(params, max_norm)
  return optim.clip_grad_norm_(params, max_norm):item()
end

optim.LRScheduler = require 'anatomy.optim.LRScheduler'

-- optim.lr_scheduler(opt, {schedule = 'cosine'|'constant', steps, warmup = 0})
-- -> a scheduler whose step() sets opt's learning rate (see LRScheduler.lua)
function optim.lr_scheduler(opt, opts) return optim.LRScheduler(opt, opts) end

return optim
