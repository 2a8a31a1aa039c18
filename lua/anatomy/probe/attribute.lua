-- attribute: patching estimated from gradients. patching.attribute gives
-- the effects patching.run measures from two forwards and one backward (AtP), with
-- AtP*'s fix for queries and keys, or from integrated gradients.
local torch = require('anatomy.torch')
local points = require('anatomy.probe.points')
local Cache = require('anatomy.probe.cache')
local hooks = require('anatomy.probe.hooks')
local scope = require('anatomy.probe.scope')
local runs = require('anatomy.probe.runs')
local inputs = require('anatomy.probe.inputs')
local options = require('anatomy.torch.options')
local terminal = require('anatomy.render.terminal')

local attribute = {}

-- The contribution (B, T, ...) summed to the grid's columns: one number
-- ('layer'), one a head, a position or a neuron (the last dimension).
local function reduce_to(contrib, per, layout)
  local d
  if per == 'layer' then return {contrib:sum():item()} end
  if per == 'head' then d = layout.head elseif per == 'position' then d = layout.pos else d = contrib:dim() end
  local t = contrib
  for dim = t:dim(), 1, -1 do if dim ~= d then t = t:sum(dim) end end
  return t:reshape(-1):tolist()
end

-- AtP*'s fix for a query or a key: the attention pattern recomputed with the
-- cell's clean query or key (the softmax is far from linear), then the
-- linear term from the pattern on: sum((pattern' - pattern) * d metric / d
-- pattern). `name` is the layer's q or k point; the attention's scores,
-- pattern and (rotated, where it rotates) q and k come from the caches. The
-- scores are first rebuilt from q and k and checked against the cached ones:
-- an attention that scores otherwise is refused, not guessed at.
local function qk_fix(name, clean_cache, corrupt_cache, grad_pattern, per, layout, where)
  local attn, which = name:match('^(.*)%.([qk])$')
  local function get(cache, point)
    local rot = rawget(cache, '_tensors')[attn .. '.rot_' .. point]
    return rot or cache[attn .. '.' .. point]
  end
  local q, k = get(corrupt_cache, 'q'):double(), get(corrupt_cache, 'k'):double()     -- (B, T, H, D), (B, T, KV, D)
  local scores, pattern = corrupt_cache[attn .. '.scores']:double(), corrupt_cache[attn .. '.pattern']:double()
  local H, KV, D = q:size(3), k:size(3), q:size(4)
  local group = torch.tensor((function() local t = {} for h = 1, H do t[h] = math.floor((h - 1) / (H / KV)) + 1 end return t end)(), {dtype = 'int64', device = k.device})
  local scale = 1 / math.sqrt(D)
  local function scores_of(qq, kk)  -- (B, H, T, T)
    return torch.matmul(qq:transpose(2, 3), kk:index_select(3, group):transpose(2, 3):transpose(3, 4)) * scale
  end
  local rebuilt = scores_of(q, k)
  local finite = torch.isfinite(scores)
  local err = (rebuilt - scores):abs():masked_fill(finite:logical_not(), 0):max():item()
  if err > 1e-3 * (1 + scores:masked_fill(finite:logical_not(), 0):abs():max():item()) then
    error(("%s: AtP*'s fix rebuilds the scores of %s from its q and k as q k^T / sqrt(%d), which differs here by %.3g; "
      .. "use method = 'atp' for this attention"):format(where, attn, D, err), 0)
  end
  local clean_side = get(clean_cache, which):double()
  local base = which == 'q' and q or k
  local delta = clean_side - base
  local dim = per == 'head' and 3 or per == 'position' and 2 or nil
  local n = dim and base:size(dim) or 1
  local out = {}
  for c = 1, n do
    local d = delta
    if dim then d = torch.zeros_like(delta); d:narrow(dim, c, 1):copy_(delta:narrow(dim, c, 1)) end
    local patched = which == 'q' and scores_of(q + d, k) or scores_of(q, k + d)
    patched = patched:masked_fill(finite:logical_not(), -math.huge)
    out[c] = ((patched:softmax(-1) - pattern) * grad_pattern:double()):sum():item()
  end
  return out
end

-- patching.attribute(model, clean, corrupt, metric, {over = 'resid_pre',
-- per = 'layer'|'head'|'position'|'neuron', method = 'atp'|'atp-qk'|'ig',
-- steps = 8, layers, tokenizer}) -> result, as patching.run's (effect,
-- normalized, print, report), estimated from gradients instead of one run
-- per cell. result.grid is the estimated effect of each patch (patched -
-- corrupt, as other attribution-patching tools give it; patching.run's
-- grid is the patched metric), result.metric the estimated metric
-- (corrupt + effect):
--   atp: attribution patching. From the clean run, the corrupt run and one
--        backward of metric on the corrupt run, each cell's effect is
--        (clean - corrupt activation) . d metric / d activation,
--        summed over the cell (a head, a position, a neuron, the layer);
--   atp-qk: for a query or key point (attn.q, attn.k), the attention pattern
--        recomputed with the cell's clean query or key and the linear term
--        taken from the pattern on: the QK fix of Kramar et al.'s AtP*
--        (2024), without its GradDrop (which anatomy does not compute, so
--        the name AtP* is not used); only for queries and keys;
--   ig:  integrated gradients: the same product with the gradient averaged
--        over `steps` runs in which that layer's activation goes from the
--        corrupt one to the clean one (midpoints), every other layer left
--        as the corrupt input makes it: exact where the metric is linear in
--        the activation, and in its sum over a layer's cells (completeness).
-- metric(logits) must return a one-element tensor (patching.logit_diff
-- does). per = 'neuron' reads the activation's last dimension (mlp.post;
-- an attached SAE's features, '<point>.sae.acts', with layers naming its
-- layer: one cell a feature).
function attribute.attribute(model, clean, corrupt, metric, opts)
  local where = 'patching.attribute'
  hooks.require_clean(model, where, 2)
  opts = options.check(opts, {'over', 'per', 'layers', 'method', 'steps', 'tokenizer', 'padding_side', 'attention_mask'}, where, 2)
  if type(metric) ~= 'function' then error(('%s: metric must be a function(logits) -> a one-element tensor, got %s'):format(where, type(metric)), 2) end
  local over, per, method = opts.over or 'resid_pre', opts.per or 'layer', opts.method or 'atp'
  if per ~= 'layer' and per ~= 'head' and per ~= 'position' and per ~= 'neuron' then
    error(("%s: per must be 'layer', 'head', 'position' or 'neuron', got '%s'"):format(where, tostring(per)), 2)
  end
  if method == 'atp*' then
    error(("%s: method = 'atp*' would be Kramar et al.'s AtP*, the QK fix and GradDrop; anatomy computes the QK fix alone, "
      .. "as method = 'atp-qk' (for attn.q and attn.k), and not GradDrop"):format(where), 2)
  end
  if method ~= 'atp' and method ~= 'atp-qk' and method ~= 'ig' then
    error(("%s: method must be 'atp', 'atp-qk' or 'ig', got '%s'"):format(where, tostring(method)), 2)
  end
  local steps = options.whole(opts.steps, 'steps', where, 8)
  local clean_ids, corrupt_ids, mask = runs.id_pair(model, clean, corrupt, opts, where)
  local names, rows = runs.layer_points(model, over, where, opts.layers)
  local layout = points.layout(model, names[1])
  if per == 'head' and not layout.head then
    error(("%s: per = 'head' needs a point with heads (attn.q, k, v, z, result, pattern, scores), got '%s'"):format(where, over), 2)
  end
  -- the QK fix: a query or key point is scored through its attention's pattern
  local fixed = method == 'atp-qk'
  if fixed and not names[1]:match('%.[qk]$') then
    error(("%s: method = 'atp-qk' recomputes the attention pattern for a query or key (attn.q, attn.k); over '%s' is neither, "
      .. "and there it would be method = 'atp'"):format(where, over), 2)
  end
  if fixed and per == 'neuron' then error(("%s: per = 'neuron' has no meaning for a query or key"):format(where), 2) end
  local extra = {}
  if fixed then
    local known = {}
    for _, n in ipairs(points.names(model)) do known[n] = true end
    for _, name in ipairs(names) do
      local attn = name:match('^(.*)%.[qk]$')
      for _, p in ipairs{'q', 'k', 'rot_q', 'rot_k', 'scores', 'pattern'} do
        if known[attn .. '.' .. p] then extra[#extra + 1] = attn .. '.' .. p end  -- rot_q, rot_k: a rotary attention's
      end
    end
  end
  local filter = {}
  for _, n in ipairs(names) do filter[#filter + 1] = n end
  for _, n in ipairs(extra) do filter[#filter + 1] = n end
  -- in eval mode; the backwards below reach the parameters too: their
  -- gradients, the modes and the hooks come back as they were (probe.scope)
  return scope.run(model, function()
    local clean_out, clean_cache = Cache.run_with_cache(model, clean_ids, {filter = filter, attention_mask = mask})
    local clean_metric = runs.as_number(metric(clean_out, mask), where)
    local corrupt_out, corrupt_cache = Cache.run_with_cache(model, corrupt_ids, {filter = filter, grad = true, attention_mask = mask})
    local m = runs.as_scalar(metric(corrupt_out, mask), where)
    local corrupt_metric = m:item()
    local grads = {}
    if method ~= 'ig' then
      m:backward()
      for _, name in ipairs(names) do
        grads[name] = corrupt_cache.grads[name]
        if grads[name] == nil then error(("%s: no gradient reached '%s' (does the metric depend on it?)"):format(where, name), 0) end
      end
    else
      for _, name in ipairs(names) do
        local delta = clean_cache[name] - corrupt_cache[name]
        local base = corrupt_cache[name]
        local sum
        for k = 1, steps do
          local alpha = (k - 0.5) / steps
          local at
          scope.run(model, function()
            hooks.replace(model, name, function()
              at = (base + delta * alpha):detach():requires_grad_(true)
              return at
            end)
            local out = inputs.forward(model, corrupt_ids, mask, where)
            runs.as_scalar(metric(out, mask), where):backward()
            sum = sum and sum + at.grad or at.grad
          end)
        end
        grads[name] = sum / steps
      end
    end
    local grid, cols = {}, nil
    for i, name in ipairs(names) do
      local values
      if fixed then
        local attn = name:match('^(.*)%.[qk]$')
        local gp = corrupt_cache.grads[attn .. '.pattern']
        if gp == nil then error(("%s: no gradient reached '%s.pattern'"):format(where, attn), 0) end
        values = qk_fix(name, clean_cache, corrupt_cache, gp, per, layout, where)
      else
        values = reduce_to((clean_cache[name] - corrupt_cache[name]):double() * grads[name]:double(), per, layout)
      end
      grid[i] = {}
      for c, v in ipairs(values) do grid[i][c] = v end
      if not cols then
        cols = {}
        if per == 'layer' then cols[1] = 'all'
        elseif per == 'head' then for h = 1, #values do cols[h] = 'head ' .. h end
        elseif per == 'position' then
          local tokens = clean_cache.tokens[1]
          for t = 1, #values do cols[t] = ('%d %s'):format(t, terminal.token_label(tokens[t] or '', 8)) end
        else for n = 1, #values do cols[n] = 'neuron ' .. n end end
      end
    end
    local effect = torch.tensor(grid, {device = 'cpu', dtype = 'float64'})
    local noise, examples = runs.spread(metric, clean_out, corrupt_out, mask, where)
    return runs.result{grid = effect, values = grid, effect = effect, metric = effect + corrupt_metric, rows = rows, points = names,
      cols = cols, over = over, per = per, clean = clean_metric, corrupt = corrupt_metric, noise = noise, examples = examples,
      method = method, steps = method == 'ig' and steps or nil}
  end, {mode = 'eval', grads = true})
end

hooks.analysis(attribute.attribute)

return attribute
