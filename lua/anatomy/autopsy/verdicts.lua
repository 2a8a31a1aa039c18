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
local measure = require('anatomy.autopsy.measure')

local verdicts = {}

-- The defaults (autopsy.thresholds; override with autopsy.run's opts.thresholds).
verdicts.thresholds = {exploding = 2.0, passenger = 0.05, passenger_grad = 0.02, passenger_removal = 0.01, boundary = 0.5,
  boundary_middle = 0.1}

-- verdicts.assign(a, thresholds): sets grad_share and verdict on every row of autopsy a.
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
  -- a script run with --smoke=true (experiment.config): a few steps, to test the script; no verdict means anything
  local experiment = package.loaded['anatomy.experiment']
  if experiment and experiment.smoke then
    for _, r in ipairs(a.rows) do if r.verdict then r.verdict = 'smoke run: not meaningful' end end
  end
end

return verdicts
