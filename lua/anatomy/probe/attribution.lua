-- Direct logit attribution: the final residual stream of a pre-norm model
-- is the embedding plus what every attention head and every MLP wrote into
-- it; with the final norm's scale held at its value in this run, the
-- readout is linear in the stream, so each part's share of a logit is the
-- readout of that part alone (less the readout of nothing, which is the
-- norm's and the head's bias, a row of its own). The parts sum to the
-- model's logit. probe.logit_attribution(model, input, target, opts).
local torch = require('anatomy.torch')
local points = require('anatomy.probe.points')
local hooks = require('anatomy.probe.hooks')
local inputs = require('anatomy.probe.inputs')
local Cache = require('anatomy.probe.cache')
local options = require('anatomy.torch.options')
local terminal = require('anatomy.render.terminal')
local charts = require('anatomy.render.charts')
local nn = require('anatomy.nn')

local attribution = {}

local Result = {}
Result.__index = Result
attribution.Result = Result

-- The child of a layer that has hook point `point` (an attention's 'result',
-- an MLP's 'post'), with its path.
local function child_with(model, layer, point)
  for n, m in model:named_modules() do
    if n:sub(1, #layer + 1) == layer .. '.' then
      for _, p in ipairs(m:hook_points()) do
        if p == point then return n, m end
      end
    end
  end
end

-- probe.logit_attribution(model, input, target, {position = -1, tokenizer})
-- -> result: target is a token (id or one-token text) or {good, bad} (their
-- logit difference); input ids or text (probe.to_ids), averaged over the
-- batch. result.rows = {{name, value}, ...} in the model's order: 'embed',
-- each layer's heads ('blocks.1.attn head 1', ...) and attention bias, its
-- MLP, and 'bias'; result.total (their sum) and result.logit (the model's).
function attribution.run(model, input, target, opts)
  local where = 'probe.logit_attribution'
  opts = options.check(opts, {'position', 'tokenizer'}, where, 2)
  local ids, tok = inputs.to_ids(model, input, opts.tokenizer, where)
  local good, bad
  if type(target) == 'table' then
    good = inputs.token_id(target[1], tok, where, 'target[1]')
    bad = inputs.token_id(target[2], tok, where, 'target[2]')
  else
    good = inputs.token_id(target, tok, where, 'target')
  end
  if type(model.readout) ~= 'function' then
    error(('%s: %s has no readout(h) (the head applied to a hidden state): define it to attribute logits'):format(where, nn.typename(model)), 2)
  end
  local layers, why = model:layers()
  if not layers then error(('%s: %s'):format(where, why), 2) end
  local first, last = layers[1][1], layers[#layers][1]
  local filter, plan = {first .. '.resid_pre', last}, {}
  local inside = {}
  for i, l in ipairs(layers) do
    local attn = child_with(model, l[1], 'result')
    local mlp = child_with(model, l[1], 'post') or child_with(model, l[1], 'router_logits')  -- an nn.MoE: its experts' weighted sum
    if not attn and not mlp then
      error(('%s: layer %s has neither an attention with per-head results (hook point result) nor an MLP (hook point post)'):format(where, l[1]), 2)
    end
    plan[i] = {layer = l[1], attn = attn, mlp = mlp}
    if attn then filter[#filter + 1] = attn; filter[#filter + 1] = attn .. '.result' end
    if mlp then filter[#filter + 1] = mlp end
    inside[l[1]] = true
  end
  local norms = {}  -- norms outside the layers: the final one(s) the readout goes through
  for n, m in model:named_modules() do
    local in_layer = false
    for l in pairs(inside) do in_layer = in_layer or n == l or n:sub(1, #l + 1) == l .. '.' end
    if not in_layer then
      for _, p in ipairs(m:hook_points()) do
        if p == 'scale' then norms[#norms + 1] = n; filter[#filter + 1] = n .. '.scale' end
      end
    end
  end
  local ok_check, has_pre = pcall(points.locate, model, first .. '.resid_pre', 1)
  if not ok_check then error(('%s: the first layer publishes no resid_pre (the embedding): %s'):format(where, has_pre), 2) end

  local logits, cache = Cache.run_with_cache(model, ids, {filter = filter})
  local T = ids:size(2)
  local p = inputs.position(opts.position or -1, T, where)
  local function at(name) return cache[name]:select(2, p) end  -- (B, ...)
  local names, parts = {'embed'}, {at(first .. '.resid_pre')}
  local sum = parts[1]:clone()
  for _, step in ipairs(plan) do
    if step.attn then
      local result = at(step.attn .. '.result')  -- (B, H, C)
      local out = at(step.attn)
      for h = 1, result:size(2) do
        names[#names + 1] = ('%s head %d'):format(step.attn, h)
        parts[#parts + 1] = result:select(2, h)
      end
      names[#names + 1] = step.attn .. ' bias'
      parts[#parts + 1] = out - result:sum(2)
      sum = sum + out
    end
    if step.mlp then
      names[#names + 1] = step.mlp
      parts[#parts + 1] = at(step.mlp)
      sum = sum + parts[#parts]
    end
  end
  local final = at(last)
  local gap = (sum - final):abs():max():item()
  local size = final:abs():max():item()
  if gap > 1e-4 * (1 + size) then
    error(('%s: the residual stream of %s is not the sum of the embedding and the attention and MLP outputs (largest gap %.3g '
      .. 'against values up to %.3g): direct logit attribution needs pre-norm residual blocks%s'):format(where, nn.typename(model), gap, size,
      nn.typename(model) == 'models.GPT' and " (models.gpt is post-norm unless built with norm = 'pre')" or ''), 2)
  end

  -- every part (and nothing, for the bias) read out in one batch, each norm's scale held at this run's
  local B, P = ids:size(1), #parts + 1
  parts[P] = torch.zeros_like(parts[1])
  local stacked = torch.cat(parts, 1):unsqueeze(2)  -- (P B, 1, C)
  local handles = {}
  for _, n in ipairs(norms) do
    local scale = at(n .. '.scale'):unsqueeze(2)  -- (B, 1, 1)
    local frozen = scale['repeat'](scale, P, 1, 1)  -- (P B, 1, 1)
    handles[#handles + 1] = hooks.replace(model, n .. '.scale', function() return frozen end)
  end
  local ok, out = pcall(function() return torch.no_grad(function() return model:readout(stacked) end) end)
  hooks.group(handles):remove()
  if not ok then error(out, 0) end
  local function pick(l)  -- (N, 1, V) -> (N) target logit (difference)
    local v = l:select(2, 1):select(2, good)
    if bad then v = v - l:select(2, 1):select(2, bad) end
    return v
  end
  local per = pick(out):view(P, B):mean(2):tolist()
  local rows, total = {}, per[P]
  for i = 1, P - 1 do
    rows[i] = {names[i], per[i] - per[P]}
    total = total + rows[i][2]
  end
  rows[P] = {'bias', per[P]}
  local logit = pick(logits:narrow(2, p, 1)):mean():item()
  return setmetatable({rows = rows, total = total, logit = logit, position = p, target = {good, bad},
    label = bad and ('logit[%d] - logit[%d]'):format(good, bad) or ('logit[%d]'):format(good),
    tokens = cache.tokens[1]}, Result)
end

-- result:top(n) -> the n rows of largest |value|, largest first
function Result:top(n)
  local sorted = {}
  for i, r in ipairs(self.rows) do sorted[i] = r end
  table.sort(sorted, function(a, b) return math.abs(a[2]) > math.abs(b[2]) end)
  local out = {}
  for i = 1, math.min(n or #sorted, #sorted) do out[i] = sorted[i] end
  return out
end

function Result:__tostring()
  local title = ('direct logit attribution of %s at position %d (%s): parts sum to %.5g, the model gives %.5g; largest 20 by |value|'):format(
    self.label, self.position, terminal.token_label(self.tokens[self.position] or '', 12), self.total, self.logit)
  return terminal.signed_bars(title, self:top(20))
end

-- result:svg() -> the parts as a bar chart (in the model's order; negative bars below the axis)
function Result:svg()
  local labels, values = {}, {}
  for i, r in ipairs(self.rows) do labels[i], values[i] = r[1], r[2] end
  return charts.signed_bars(('Direct logit attribution: %s'):format(self.label), labels, values,
    ('parts sum to %.5g; the model gives %.5g'):format(self.total, self.logit))
end

return attribution
