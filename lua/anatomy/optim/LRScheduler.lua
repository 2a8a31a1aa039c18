-- optim.LRScheduler(opt, {schedule = 'cosine'|'constant', steps, warmup = 0}):
-- the learning-rate schedule of train.fit (optim.schedule), for a training
-- loop of your own. It takes the optimizer's current lr as the peak, sets
-- the rate of step 1 at once, and each step() moves to the next step's rate
-- (call it after opt:step(), as in PyTorch).
local options = require('anatomy.torch.options')
local LRScheduler = {}
LRScheduler.__index = LRScheduler

setmetatable(LRScheduler, {__call = function(_, opt, opts)
  if type(opt) ~= 'table' or type(opt.set_lr) ~= 'function' then
    error('optim.lr_scheduler: the first argument must be an optimizer (optim.AdamW, optim.Adam, optim.SGD)', 3)
  end
  opts = options.check(opts, {schedule = true, steps = true, warmup = true}, 'optim.lr_scheduler', 3)
  -- steps = nan, inf or 1.5 were taken as the schedule's length, silently
  if opts.steps == nil then error('optim.lr_scheduler: steps is required (the length of the run, a whole number >= 1)', 3) end
  local steps = options.whole(opts.steps, 'steps', 'optim.lr_scheduler', nil, 1, 4)
  local warmup = options.whole(opts.warmup, 'warmup', 'optim.lr_scheduler', 0, 0, 4)
  local self = setmetatable({opt = opt, step_count = 1, base_lr = opt:lr(),
    lr_at = require('anatomy.optim').schedule(  -- lazy: optim/init.lua requires this file
      opts.schedule or 'cosine', opt:lr(), steps, warmup)}, LRScheduler)
  opt:set_lr(self.lr_at(1))
  return self
end})

-- sched:step(): on to the next step's learning rate
function LRScheduler:step()
  self.step_count = self.step_count + 1
  self.opt:set_lr(self.lr_at(self.step_count))
end

-- sched:get_last_lr() -> the learning rate set last
function LRScheduler:get_last_lr() return self.opt:lr() end

return LRScheduler
