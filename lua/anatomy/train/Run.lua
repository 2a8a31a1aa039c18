-- train.Run: what train.fit returns. train (loss per step), val ({step,
-- loss} per evaluation), steps, seconds, tokens_per_second, interrupted
-- (Ctrl-C stopped it at a step boundary), depth_losses (with recurrence:
-- per step, the loss of each pass, depth 0 first), probes (with probe: per
-- probed step, {step, grad_norm = {param = norm}, act_std = {point = std}}),
-- config (the settings saved in each checkpoint), communication (data-parallel).
local Run = {}
Run.__index = Run

-- Run.new(config, world) -> an empty run
function Run.new(config, world)
  return setmetatable({train = {}, val = {}, depth_losses = {}, probes = {}, steps = 0, seconds = 0,
    tokens_per_second = 0, first_step = 1, config = config, world_size = world}, Run)
end

function Run:__tostring()
  local last_val = self.val[#self.val]
  return ('train.Run(%d steps%s, train loss %.4f%s, %.1f s, %.0f tokens/s)'):format(
    self.steps, self.interrupted and ', interrupted' or '', self.train[#self.train] or 0 / 0,
    last_val and (', val loss %.4f'):format(last_val.loss) or '', self.seconds, self.tokens_per_second)
end

return Run
