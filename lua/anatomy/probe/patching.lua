-- patching: activation patching. Run the model on a corrupted input with one
-- component at a time (a layer's activation, one head of it, or one
-- position) taken from the clean run, and measure how much of the clean
-- behaviour comes back: the components that restore it are the ones that
-- carry the information.
--   local metric = patching.logit_diff(' Mary', ' John', {tokenizer = tok})
--   local r = patching.run(model, clean, corrupt, metric, {over = 'attn.z', per = 'head'})
--   print(r); r:report('out/patching.html')
local points = require('anatomy.probe.points')
local inputs = require('anatomy.probe.inputs')
local Cache = require('anatomy.probe.cache')
local interventions = require('anatomy.probe.interventions')
local hooks = require('anatomy.probe.hooks')
local options = require('anatomy.torch.options')
local terminal = require('anatomy.render.terminal')
local charts = require('anatomy.render.charts')
local page = require('anatomy.render.page')
local fs = require('anatomy.io.fs')
local format = require('anatomy.render.format')

local patching = {}


-- patching.logit_diff(good, bad, {position = -1, tokenizer}) -> metric:
-- metric(logits) is the mean over the batch of logits[good] - logits[bad] (a
-- one-element tensor, which carries the gradient) at
-- the position (1-based; negative from the end). good and bad: token ids or
-- one-token texts. bad = nil: the logit of good alone.
function patching.logit_diff(good, bad, opts)
  local where = 'patching.logit_diff'
  opts = options.check(opts, {'position', 'tokenizer'}, where, 2)
  local g = inputs.token_id(good, opts.tokenizer, where, 'good')
  local b = bad ~= nil and inputs.token_id(bad, opts.tokenizer, where, 'bad') or nil
  local position = opts.position or -1
  if type(position) ~= 'number' or position % 1 ~= 0 or position == 0 then
    error(('%s: position must be a non-zero integer (negative from the end), got %s'):format(where, tostring(position)), 2)
  end
  return function(logits)
    local p = inputs.position(position, logits:size(2), where, 'the logits')
    local at = logits:select(2, p)  -- (B, V)
    local d = at:select(2, g)
    if b then d = d - at:select(2, b) end
    return d:mean()  -- a one-element tensor: patching.attribute takes its gradient; the others read it as a number
  end
end

-- The hook point `over` names in layer `layer`: '<layer>.<over>' when that is
-- a probe point; else, for 'attn.*' or 'mlp.*', the layer's attention (the
-- child with a 'z' hook point) or MLP (with 'post') under its own name, so
-- 'attn.z' reaches Llama's self_attn and GPT-NeoX's attention too.
function patching.point(model, layer, over)
  local name = layer .. '.' .. over
  if pcall(points.locate, model, name, 1) then return name end
  local role, rest = over:match('^(%w+)%.(.+)$')
  local mod
  for n, m in model:named_modules() do if n == layer then mod = m end end
  if mod and (role == 'attn' or role == 'mlp') then
    for child_name, child in mod:named_children() do
      for _, p in ipairs(child:hook_points()) do
        if (role == 'attn' and p == 'z') or (role == 'mlp' and p == 'post') then
          local candidate = layer .. '.' .. child_name .. '.' .. rest
          if pcall(points.locate, model, candidate, 1) then return candidate end
        end
      end
    end
  end
  local _, err = pcall(points.locate, model, name, 1)
  error(err, 0)
end

-- The clean and corrupt ids of a patching call, of one shape (an error at
-- the caller's caller otherwise).
local function id_pair(model, clean, corrupt, tokenizer, where)
  local clean_ids = inputs.to_ids(model, clean, tokenizer, where)
  local corrupt_ids = inputs.to_ids(model, corrupt, tokenizer, where)
  if format.shape(clean_ids) ~= format.shape(corrupt_ids) then
    error(('%s: clean is %s tokens and corrupt %s; they must have one shape'):format(where, format.shape(clean_ids),
      format.shape(corrupt_ids)), 3)
  end
  return clean_ids, corrupt_ids
end

-- The point `over` names in every layer of model:layers(): names, and the
-- layers' names (the grid's rows).
local function layer_points(model, over, where)
  local layers, why = model:layers()
  if not layers then error(('%s: %s'):format(where, why), 3) end
  local names, rows = {}, {}
  for i, l in ipairs(layers) do
    local ok, name = pcall(patching.point, model, l[1], over)
    if not ok then error(('%s: %s'):format(where, name), 3) end
    names[i], rows[i] = name, l[1]
  end
  return names, rows
end

local Result = {}
Result.__index = Result
patching.Result = Result

local function as_number(v, where)
  if torch.is_tensor(v) then
    if v:numel() ~= 1 then error(('%s: the metric returned a tensor of %d values; it must return one number'):format(where, v:numel()), 0) end
    v = v:item()
  end
  if type(v) ~= 'number' then error(('%s: the metric returned a %s; it must return a number'):format(where, type(v)), 0) end
  return v
end

-- patching.run(model, clean, corrupt, metric, {over = 'resid_pre', per =
-- 'layer'|'head'|'position', tokenizer}) -> result. clean and corrupt: ids
-- or texts of one shape; metric(logits) -> a number. For each layer of
-- model:layers() (and each head or position of it), the corrupt input runs
-- with that part of `over` patched in from the clean run. result.grid
-- (L x columns) holds the metric, result:normalized() the share of the way
-- from corrupt (0) to clean (1); print(result), result:report(path).
function patching.run(model, clean, corrupt, metric, opts)
  local where = 'patching.run'
  opts = options.check(opts, {'over', 'per', 'tokenizer'}, where, 2)
  if type(metric) ~= 'function' then error(('%s: metric must be a function(logits) -> number, got %s'):format(where, type(metric)), 2) end
  local over, per = opts.over or 'resid_pre', opts.per or 'layer'
  if per ~= 'layer' and per ~= 'head' and per ~= 'position' then
    error(("%s: per must be 'layer', 'head' or 'position', got '%s'"):format(where, tostring(per)), 2)
  end
  local clean_ids, corrupt_ids = id_pair(model, clean, corrupt, opts.tokenizer, where)
  local names, rows = layer_points(model, over, where)
  local clean_out, cache = Cache.run_with_cache(model, clean_ids, {filter = names})
  local function run_corrupt() return torch.no_grad(function() return model(corrupt_ids) end) end
  local clean_metric = as_number(metric(clean_out), where)
  local corrupt_metric = as_number(metric(run_corrupt()), where)
  local first = cache[names[1]]
  if first == nil then error(("%s: the clean run published nothing at '%s'"):format(where, names[1]), 2) end
  local cols, key = {'all'}, nil
  local layout = points.layout(names[1])
  if per == 'head' then
    if not layout.head then error(("%s: per = 'head' needs a point with heads (attn.q, k, v, z, result, pattern, scores), got '%s'"):format(where, over), 2) end
    cols, key = {}, 'head'
    for h = 1, first:size(layout.head) do cols[h] = 'head ' .. h end
  elseif per == 'position' then
    cols, key = {}, 'position'
    local tokens = cache.tokens[1]
    for t = 1, first:size(layout.pos) do cols[t] = ('%d %s'):format(t, terminal.token_label(tokens[t] or '', 8)) end
  end
  local grid = {}
  for i, name in ipairs(names) do
    grid[i] = {}
    for c = 1, #cols do
      local handle = interventions.patch(model, name, cache, key and {[key] = c} or nil)
      local ok, out = pcall(run_corrupt)
      handle:remove()
      if not ok then error(out, 0) end
      grid[i][c] = as_number(metric(out), where)
    end
  end
  return setmetatable({grid = torch.tensor(grid), values = grid, rows = rows, points = names, cols = cols, over = over, per = per,
    clean = clean_metric, corrupt = corrupt_metric}, Result)
end

-- The metric of a run as a scalar tensor that can carry a gradient (a
-- number is refused: attribution needs the graph).
local function as_scalar(v, where)
  if not torch.is_tensor(v) or v:numel() ~= 1 then
    error(('%s: the metric must return a one-element tensor that carries the gradient (patching.logit_diff does; '
      .. 'a number, :item(), has none), got %s'):format(where, torch.is_tensor(v) and format.shape(v) or type(v)), 0)
  end
  return v:reshape({})
end

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
    local rot = cache[attn .. '.rot_' .. point]
    return rot or cache[attn .. '.' .. point]
  end
  local q, k = get(corrupt_cache, 'q'):double(), get(corrupt_cache, 'k'):double()     -- (B, T, H, D), (B, T, KV, D)
  local scores, pattern = corrupt_cache[attn .. '.scores']:double(), corrupt_cache[attn .. '.pattern']:double()
  local H, KV, D = q:size(3), k:size(3), q:size(4)
  local group = torch.tensor((function() local t = {} for h = 1, H do t[h] = math.floor((h - 1) / (H / KV)) + 1 end return t end)(), {dtype = 'int64'})
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
-- per = 'layer'|'head'|'position'|'neuron', method = 'atp'|'atp*'|'ig',
-- steps = 8, tokenizer}) -> result, as patching.run's (grid, normalized,
-- print, report), estimated from gradients instead of one run per cell:
--   atp: attribution patching. From the clean run, the corrupt run and one
--        backward of metric on the corrupt run, each cell is
--        corrupt + (clean - corrupt activation) . d metric / d activation,
--        summed over the cell (a head, a position, a neuron, the layer);
--   atp*: for a query or key point (attn.q, attn.k), the attention pattern
--        recomputed with the cell's clean query or key and the linear term
--        taken from the pattern on (Kramar et al., 2024); elsewhere atp;
--   ig:  integrated gradients: the same product with the gradient averaged
--        over `steps` runs in which that layer's activation goes from the
--        corrupt one to the clean one (midpoints), every other layer left
--        as the corrupt input makes it: exact where the metric is linear in
--        the activation, and in its sum over a layer's cells (completeness).
-- metric(logits) must return a one-element tensor (patching.logit_diff
-- does). per = 'neuron' reads the activation's last dimension (mlp.post).
function patching.attribute(model, clean, corrupt, metric, opts)
  local where = 'patching.attribute'
  opts = options.check(opts, {'over', 'per', 'method', 'steps', 'tokenizer'}, where, 2)
  if type(metric) ~= 'function' then error(('%s: metric must be a function(logits) -> a one-element tensor, got %s'):format(where, type(metric)), 2) end
  local over, per, method = opts.over or 'resid_pre', opts.per or 'layer', opts.method or 'atp'
  if per ~= 'layer' and per ~= 'head' and per ~= 'position' and per ~= 'neuron' then
    error(("%s: per must be 'layer', 'head', 'position' or 'neuron', got '%s'"):format(where, tostring(per)), 2)
  end
  if method ~= 'atp' and method ~= 'atp*' and method ~= 'ig' then
    error(("%s: method must be 'atp', 'atp*' or 'ig', got '%s'"):format(where, tostring(method)), 2)
  end
  local steps = opts.steps or 8
  if type(steps) ~= 'number' or steps % 1 ~= 0 or steps < 1 then error(('%s: steps must be a positive integer, got %s'):format(where, tostring(steps)), 2) end
  local clean_ids, corrupt_ids = id_pair(model, clean, corrupt, opts.tokenizer, where)
  local names, rows = layer_points(model, over, where)
  local layout = points.layout(names[1])
  if per == 'head' and not layout.head then
    error(("%s: per = 'head' needs a point with heads (attn.q, k, v, z, result, pattern, scores), got '%s'"):format(where, over), 2)
  end
  -- AtP*: a query or key point is scored through its attention's pattern
  local fixed = method == 'atp*' and (over:match('%.q$') or over:match('%.k$') or over == 'q' or over == 'k') and true or false
  if fixed and per == 'neuron' then error(("%s: per = 'neuron' has no meaning for a query or key"):format(where), 2) end
  local extra = {}
  if fixed then
    for _, name in ipairs(names) do
      local attn = name:match('^(.*)%.[qk]$')
      for _, p in ipairs{'q', 'k', 'rot_q', 'rot_k', 'scores', 'pattern'} do extra[#extra + 1] = attn .. '.' .. p end
    end
  end
  local filter = {}
  for _, n in ipairs(names) do filter[#filter + 1] = n end
  for _, n in ipairs(extra) do filter[#filter + 1] = n end
  local was_training = model.training
  model:eval()
  -- the backwards below reach the parameters too: their gradients are put back as they were
  local saved = {}
  for _, p in ipairs(model:parameters()) do saved[#saved + 1] = {p, p.grad and p.grad:clone()} end  -- backward adds into the same tensor
  local ok, result = pcall(function()
    local clean_out, clean_cache = Cache.run_with_cache(model, clean_ids, {filter = filter})
    local clean_metric = as_number(metric(clean_out), where)
    local corrupt_out, corrupt_cache = Cache.run_with_cache(model, corrupt_ids, {filter = filter, grad = true})
    local m = as_scalar(metric(corrupt_out), where)
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
          local handle = hooks.replace(model, name, function()
            at = (base + delta * alpha):detach():requires_grad_(true)
            return at
          end)
          local run_ok, err = pcall(function()
            local out = model(corrupt_ids)
            as_scalar(metric(out), where):backward()
            sum = sum and sum + at.grad or at.grad
          end)
          handle:remove()
          if not run_ok then error(err, 0) end
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
      for c, v in ipairs(values) do grid[i][c] = corrupt_metric + v end
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
    return setmetatable({grid = torch.tensor(grid), values = grid, rows = rows, points = names, cols = cols, over = over, per = per,
      clean = clean_metric, corrupt = corrupt_metric, method = method, steps = method == 'ig' and steps or nil}, Result)
  end)
  model:train(was_training)
  for _, pg in ipairs(saved) do pg[1].grad = pg[2] end
  if not ok then error(result, 0) end
  return result
end

-- A head given as {layer, head}: layer a number (1..L) or a layer's name,
-- head 1..H. Returns the layer's name and the head.
local function head_of(model, layers, spec, what, where)
  if type(spec) ~= 'table' or spec[1] == nil or spec[2] == nil then
    error(('%s: %s must be a head as {layer, head}, got %s'):format(where, what, type(spec) == 'table' and 'a table without both' or type(spec)), 0)
  end
  local layer, head = spec[1], spec[2]
  local name
  if type(layer) == 'number' then
    if layer % 1 ~= 0 or layer < 1 or layer > #layers then
      error(('%s: %s: layer must be in 1..%d, got %s'):format(where, what, #layers, tostring(layer)), 0)
    end
    name = layers[layer][1]
  else
    local resolved = points.resolve_name(model, layer, 1)
    for _, l in ipairs(layers) do if l[1] == resolved then name = l[1] end end
    if not name then error(("%s: %s: no layer '%s'"):format(where, what, tostring(layer)), 0) end
  end
  if type(head) ~= 'number' or head % 1 ~= 0 or head < 1 then
    error(('%s: %s: head must be a positive integer, got %s'):format(where, what, tostring(head)), 0)
  end
  return name, head
end

-- A list of heads: {layer, head} or a list of them.
local function head_list(model, layers, spec, what, where)
  if type(spec) == 'table' and type(spec[1]) == 'table' then
    local out = {}
    for i, s in ipairs(spec) do
      local name, head = head_of(model, layers, s, ('%s[%d]'):format(what, i), where)
      out[i] = {name, head}
    end
    return out
  end
  local name, head = head_of(model, layers, spec, what, where)
  return {{name, head}}
end

local PathResult = {}
PathResult.__index = PathResult
patching.PathResult = PathResult

-- patching.path(model, clean, corrupt, metric, {sender = {layer, head} or a
-- list, receivers = {{layer, head}, ...} (via q, k, v) or layers (via
-- resid), via = 'q'|'k'|'v'|'resid', tokenizer}) -> result: path patching.
-- The sender heads' clean output reaches the receivers along one path only:
--   1. the clean and corrupt runs are cached (every attention's z);
--   2. the corrupt input runs with the senders' z from the clean run and
--      every other head's z frozen at its corrupt value (the MLPs
--      recomputed), and the receivers' inputs are recorded there: each
--      receiver head's q, k or v (via), or each receiver layer's resid_pre;
--   3. the corrupt input runs with only those receiver inputs patched in
--      from step 2; result.value is the metric of that run.
-- result.clean and result.corrupt are the metric of the two runs,
-- result:normalized() the share of the way from corrupt (0) to clean (1).
function patching.path(model, clean, corrupt, metric, opts)
  local where = 'patching.path'
  opts = options.check(opts, {'sender', 'receivers', 'via', 'tokenizer'}, where, 2)
  if type(metric) ~= 'function' then error(('%s: metric must be a function(logits) -> number, got %s'):format(where, type(metric)), 2) end
  local via = opts.via or 'resid'
  if via ~= 'q' and via ~= 'k' and via ~= 'v' and via ~= 'resid' then
    error(("%s: via must be 'q', 'k', 'v' or 'resid', got %s"):format(where, tostring(via)), 2)
  end
  local layers, why = model:layers()
  if not layers then error(('%s: %s'):format(where, why), 2) end
  local index = {}
  for i, l in ipairs(layers) do index[l[1]] = i end
  if opts.sender == nil then error(('%s: sender is required: a head as {layer, head}, or a list of them'):format(where), 2) end
  if opts.receivers == nil then error(('%s: receivers are required'):format(where), 2) end
  local ok, senders = pcall(head_list, model, layers, opts.sender, 'sender', where)
  if not ok then error(senders, 2) end
  local receivers = {}
  if via == 'resid' then
    local list = type(opts.receivers) == 'table' and opts.receivers or {opts.receivers}
    for i, l in ipairs(list) do
      local name
      if type(l) == 'number' and l % 1 == 0 and l >= 1 and l <= #layers then name = layers[l][1]
      elseif type(l) == 'string' then name = points.resolve_name(model, l, 2) end
      if not name or not index[name] then
        error(('%s: receivers[%d] must be a layer (1..%d or a name) when via is resid, got %s'):format(where, i, #layers, tostring(l)), 2)
      end
      receivers[i] = {name}
    end
  else
    ok, receivers = pcall(head_list, model, layers, opts.receivers, 'receivers', where)
    if not ok then error(receivers, 2) end
  end
  local first_receiver = math.huge
  for _, r in ipairs(receivers) do first_receiver = math.min(first_receiver, index[r[1]]) end
  for _, s in ipairs(senders) do
    if index[s[1]] >= first_receiver then
      error(('%s: the sender %s head %d is not before the receivers (the first is in %s): no path runs from it to them'):format(
        where, s[1], s[2], layers[first_receiver][1]), 2)
    end
  end
  local clean_ids, corrupt_ids = id_pair(model, clean, corrupt, opts.tokenizer, where)
  -- every layer's z, and where each receiver reads
  local z_names, receiver_names = {}, {}
  for i, l in ipairs(layers) do
    local found, name = pcall(patching.point, model, l[1], 'attn.z')
    if not found then error(('%s: %s'):format(where, name), 2) end
    z_names[i] = name
  end
  for i, r in ipairs(receivers) do
    local found, name = pcall(patching.point, model, r[1], via == 'resid' and 'resid_pre' or ('attn.' .. via))
    if not found then error(('%s: %s'):format(where, name), 2) end
    receiver_names[i] = name
  end
  local clean_out, clean_cache = Cache.run_with_cache(model, clean_ids, {filter = z_names})
  local corrupt_out, corrupt_cache = Cache.run_with_cache(model, corrupt_ids, {filter = z_names})
  local layout = points.layout(z_names[1])
  for _, s in ipairs(senders) do
    local H = clean_cache[z_names[index[s[1]]]]:size(layout.head)
    if s[2] > H then error(('%s: sender head must be in 1..%d for %s, got %d'):format(where, H, s[1], s[2]), 2) end
  end
  -- step 2: the senders from clean, every other head frozen at corrupt
  local by_layer = {}
  for _, s in ipairs(senders) do
    by_layer[index[s[1]]] = by_layer[index[s[1]]] or {}
    table.insert(by_layer[index[s[1]]], s[2])
  end
  local handles = {}
  for i, name in ipairs(z_names) do
    local frozen, from_clean = corrupt_cache[name], clean_cache[name]
    local heads = by_layer[i]
    handles[#handles + 1] = hooks.replace(model, name, function()
      local out = frozen:clone()
      for _, h in ipairs(heads or {}) do out:narrow(layout.head, h, 1):copy_(from_clean:narrow(layout.head, h, 1)) end
      return out
    end)
  end
  local step2_ok, step2_out_or_error, step2 = pcall(Cache.run_with_cache, model, corrupt_ids, {filter = receiver_names})
  for _, h in ipairs(handles) do h:remove() end
  if not step2_ok then error(step2_out_or_error, 0) end
  -- step 3: the receivers' inputs from step 2, nothing else
  handles = {}
  for i, r in ipairs(receivers) do
    local key = via ~= 'resid' and {head = r[2]} or nil
    local patched_ok, handle = pcall(interventions.patch, model, receiver_names[i], step2, key)
    if not patched_ok then
      for _, h in ipairs(handles) do h:remove() end
      error(('%s: receivers[%d]: %s'):format(where, i, tostring(handle):gsub('^[^\n]-:%d+: ', '')), 2)
    end
    handles[#handles + 1] = handle
  end
  local run_ok, out = pcall(function() return torch.no_grad(function() return model(corrupt_ids) end) end)
  for _, h in ipairs(handles) do h:remove() end
  if not run_ok then error(out, 0) end
  local describe = {}
  for i, s in ipairs(senders) do describe[i] = ('%s head %d'):format(s[1], s[2]) end
  local into = {}
  for i, r in ipairs(receivers) do into[i] = r[2] and ('%s head %d'):format(r[1], r[2]) or r[1] end
  return setmetatable({value = as_number(metric(out), where), clean = as_number(metric(clean_out), where),
    corrupt = as_number(metric(corrupt_out), where), senders = describe, receivers = into, via = via}, PathResult)
end

-- result:normalized() -> (value - corrupt) / (clean - corrupt)
function PathResult:normalized()
  local span = self.clean - self.corrupt
  if span == 0 then error('patching.path: clean and corrupt give the same metric; nothing to normalise by', 2) end
  return (self.value - self.corrupt) / span
end

function PathResult:__tostring()
  local span = self.clean - self.corrupt
  return ('path patching: %s -> %s via %s: metric %.4g (clean %.4g, corrupt %.4g%s)'):format(table.concat(self.senders, ', '),
    table.concat(self.receivers, ', '), self.via, self.value, self.clean, self.corrupt,
    span ~= 0 and (', normalized %.3f'):format((self.value - self.corrupt) / span) or '')
end

-- result:normalized() -> (grid - corrupt) / (clean - corrupt): 0 where the
-- patch changes nothing, 1 where it restores the clean metric.
function Result:normalized()
  local span = self.clean - self.corrupt
  if span == 0 then error('patching: clean and corrupt give the same metric; nothing to normalise by', 2) end
  return (self.grid - self.corrupt) / span
end

function Result:__tostring()
  local title = ('activation patching of %s per %s: the metric with each part patched from clean into corrupt (clean %.4g, corrupt %.4g)'):format(
    self.over, self.per, self.clean, self.corrupt)
  return terminal.heatmap(title, self.rows, self.cols, self.values)
end

-- result:svg() -> the grid as a labelled heatmap (charts.heatmap)
function Result:svg()
  local note = ('metric: clean %.4g, corrupt %.4g; each cell: the metric with that part of %s patched from the clean run'):format(
    self.clean, self.corrupt, self.over)
  return charts.heatmap(('Activation patching: %s per %s'):format(self.over, self.per), self.rows, self.cols,
    self.values, false, note)
end

-- result:report(path) -> path: a self-contained HTML page with the heatmap
-- and the grid as a table (written atomically)
function Result:report(path)
  local esc = charts.esc
  local head = {'<tr><th>layer</th>'}
  for _, c in ipairs(self.cols) do head[#head + 1] = '<th>' .. esc(c) .. '</th>' end
  local body = {}
  for i, r in ipairs(self.rows) do
    local tds = {'<tr><td>' .. esc(r) .. '</td>'}
    for _, v in ipairs(self.values[i]) do tds[#tds + 1] = ('<td>%.4g</td>'):format(v) end
    body[#body + 1] = table.concat(tds) .. '</tr>'
  end
  local html = page.new('Activation patching', self:svg() ..
    '<table><thead>' .. table.concat(head) .. '</tr></thead><tbody>' .. table.concat(body) .. '</tbody></table>')
  return fs.write_atomic(path, html)
end

return patching
