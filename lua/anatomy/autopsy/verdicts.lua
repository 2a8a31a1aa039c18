-- The autopsy's verdicts on each row, and the thresholds they use, in one place.
--   exploding  the residual stream's growth compounding: std(output) /
--              std(input) above `exploding` in this block and in the block
--              before or after it (one block that scales a small embedding
--              up, as the first block of a pre-norm GPT-2 does, is not)
--   passenger  a block whose f(x) is small beside x (residual ratio below
--              `passenger`), whose parameters get almost no gradient (below
--              `passenger_grad` of the largest row's), or whose removal raises
--              the loss by less than `passenger_removal` of the full model's
--              loss: the gradient, or the computation, passes it by. For a
--              residual wrapper whose skip path is not the identity (nn.Gate,
--              nn.HyperConnections, a wrapper that declares residual_branch),
--              f's own: f_residual and f_removal_loss (f zeroed, the wrapper's
--              path kept) in place of residual and removal_loss, which also
--              count the wrapper's path (gate(x) - x) as the block's work
--   boundary   an input or output row holding at least `boundary` of the
--              largest gradient while the median block holds under `boundary_middle`
--   worker     a block that is none of these
-- And each expert of a layer holding an nn.MoE (verdicts.experts), with
-- verdicts.expert_thresholds (in a.thresholds only for a model with one):
--   dead       its load (share of the routed top-k slots) at most
--              `dead_expert` (default 0: no token routed to it at all)
--   passenger  removing it (the router as if it were not there) raises the
--              loss by less than `passenger_expert` of the full model's loss
--   worker     an expert that is neither
local measure = require('anatomy.autopsy.measure')

local verdicts = {}

-- The defaults (autopsy.thresholds; override with autopsy.run's opts.thresholds).
verdicts.thresholds = {exploding = 2.0, passenger = 0.05, passenger_grad = 0.02, passenger_removal = 0.01, boundary = 0.5,
  boundary_middle = 0.1}

-- The experts' defaults, added to a.thresholds when a layer holds an nn.MoE.
verdicts.expert_thresholds = {passenger_expert = 0.01, dead_expert = 0}

-- verdicts.experts(a, thresholds): each MoE row's experts_dead and
-- experts_passenger (the numbers of its passengers, dead ones marked), and
-- a.moe.experts: one entry a layer and expert {layer, expert, load, tokens,
-- removal_loss, rise, verdict}.
function verdicts.experts(a, thresholds)
  a.moe.experts = {}
  for _, r in ipairs(a.rows) do
    local load, removal = r.expert_load, r.expert_removal_loss
    if load or removal then
      local dead, passengers = 0, {}
      for e = 1, #(load or removal) do
        local x = {layer = r.name, expert = e, load = load and load[e], tokens = r.expert_tokens and r.expert_tokens[e],
          removal_loss = removal and removal[e]}
        x.rise = x.removal_loss and a.loss and x.removal_loss - a.loss or nil
        if x.load and x.load <= thresholds.dead_expert then x.verdict = 'dead'; dead = dead + 1
        elseif x.rise and x.rise < thresholds.passenger_expert * a.loss then x.verdict = 'passenger'
        else x.verdict = 'worker' end
        if x.verdict == 'dead' and x.rise and x.rise < thresholds.passenger_expert * a.loss then passengers[#passengers + 1] = e .. ' (dead)'
        elseif x.verdict == 'passenger' then passengers[#passengers + 1] = tostring(e) end
        a.moe.experts[#a.moe.experts + 1] = x
      end
      r.experts_dead = load and dead or nil
      r.experts_passenger = removal and (#passengers > 0 and table.concat(passengers, ', ') or 'none') or nil
    end
  end
end

-- verdicts.assign(a, thresholds): sets grad_share and verdict on every row of
-- autopsy a (and, for a model with an nn.MoE, on its experts: verdicts.experts).
function verdicts.assign(a, thresholds)
  local largest = 0
  for _, r in ipairs(a.rows) do largest = math.max(largest, r.grad_norm or 0) end
  local shares = {}
  for _, r in ipairs(a.rows) do
    r.grad_share = largest > 0 and r.grad_norm and r.grad_norm / largest or nil
    if r.kind == 'block' then shares[#shares + 1] = r.grad_share or 0 end
  end
  local middle = measure.median(shares)
  local blocks = {}
  for _, r in ipairs(a.rows) do if r.kind == 'block' then blocks[#blocks + 1] = r end end
  local function grows(r) return r and r.amplification ~= nil and r.amplification > thresholds.exploding end
  local compounding = {}
  for i, r in ipairs(blocks) do compounding[r] = grows(r) and (grows(blocks[i - 1]) or grows(blocks[i + 1])) end
  for _, r in ipairs(a.rows) do
    if r.kind == 'block' then
      local wrapped = r.f_residual ~= nil or r.f_removal_loss ~= nil
      local residual = wrapped and r.f_residual or r.residual
      local removal = wrapped and r.f_removal_loss or r.removal_loss
      if compounding[r] then r.verdict = 'exploding'
      elseif (residual and residual < thresholds.passenger) or (r.grad_share and r.grad_share < thresholds.passenger_grad)
        or (removal and a.loss and removal - a.loss < thresholds.passenger_removal * a.loss) then
        r.verdict = 'passenger'
      else r.verdict = 'worker' end
    elseif r.grad_share and r.grad_share >= thresholds.boundary and middle < thresholds.boundary_middle then
      r.verdict = 'boundary'
    end
  end
  if a.moe then verdicts.experts(a, thresholds) end
  -- a script run with --smoke=true (experiment.config): a few steps, to test the script; no verdict means anything
  local experiment = package.loaded['anatomy.experiment']
  if experiment and experiment.smoke then
    for _, r in ipairs(a.rows) do if r.verdict then r.verdict = 'smoke run: not meaningful' end end
  end
end

return verdicts
