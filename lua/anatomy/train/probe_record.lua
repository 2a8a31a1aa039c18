-- probe_record: what a training step with probes keeps (train.fit's
-- `probe`): each parameter's gradient norm and each captured activation's
-- std. The autopsy's measure.lua offers the same functions (its step
-- snapshots and its table use them).
local torch = require('anatomy.torch')
local dist = require('anatomy.torch.dist')
local record = {}

-- record.grad_norms(model) -> {parameter name = ‖grad‖} for every parameter
-- that has a gradient, from one fused norm over all of them (one sync).
function record.grad_norms(model)
  local names, grads = {}, {}
  for name, p in model:named_parameters() do
    names[#names + 1] = name
    grads[#names] = p.grad or false
  end
  local out = {}
  for i, n in ipairs(torch.metrics.norms(grads)) do
    if n == n then out[names[i]] = n end
  end
  return out
end

-- measure.stds(tensors) -> {name = std} for a table of named tensors (the
-- activations a probe captured), computed together and read back once.
-- One convention for every act_std anatomy reports (this history and the
-- autopsy's table, torch.metrics.activation_stats): the population std,
-- sqrt(mean((x - mean)^2)), over every element. PyTorch's Tensor.std()
-- divides by n - 1 by default; over n elements the two differ by a factor
-- sqrt(n / (n - 1)).
function record.stds(captured, across_ranks)
  local names = {}
  for name, t in pairs(captured) do
    if name ~= 'grads' and torch.is_tensor(t) and t:is_floating_point() and t:numel() > 1 and not name:find('%.pattern$') then
      names[#names + 1] = name
    end
  end
  local out = {}
  if #names == 0 then return out end
  table.sort(names)  -- one order on every rank
  local values = {}
  if not across_ranks then
    for i, name in ipairs(names) do values[i] = captured[name]:detach():std({unbiased = false}):double() end
    for i, v in ipairs(torch.stack(values):tolist()) do out[names[i]] = v end
    return out
  end
  -- data-parallel: the std of each activation over every rank's batch, from
  -- the sums (count, sum, sum of squares about this rank's mean) added over ranks
  for i, name in ipairs(names) do
    local t = captured[name]:detach():double():reshape(-1)
    local n = t:numel()
    local mean = t:mean()
    values[i] = torch.stack({torch.tensor(n, {dtype = 'float64', device = t.device}), mean * n, ((t - mean) ^ 2):sum() + mean * mean * n})
  end
  local sums = dist.all_reduce(torch.stack(values), {op = 'sum'}):tolist()
  for i, row in ipairs(sums) do
    local n, s, ss = row[1], row[2], row[3]
    out[names[i]] = math.sqrt(math.max(ss - s * s / n, 0) / n)
  end
  return out
end

-- measure.probe_record(model, step, captured, across_ranks) -> {step, grad_norm =
-- {param = norm}, act_std = {point = std}}: what a training step with probes
-- keeps. In a data-parallel run (across_ranks), the gradients are already the
-- average over the ranks, and each std is that of every rank's batch together.
function record.probe_record(model, step, captured, across_ranks)
  return {step = step, grad_norm = record.grad_norms(model), act_std = record.stds(captured, across_ranks)}
end

return record
