-- patching: activation patching. Run the model on a corrupted input with one
-- component at a time (a layer's activation, one head of it, or one
-- position) taken from the clean run, and measure how much of the clean
-- behaviour comes back: the components that restore it are the ones that
-- carry the information.
--   local metric = patching.logit_diff(' Mary', ' John', {tokenizer = tok})
--   local r = patching.run(model, clean, corrupt, metric, {over = 'attn.z', per = 'head'})
--   print(r); r:report('out/patching.html')
local torch = require('anatomy.torch')
local points = require('anatomy.probe.points')
local inputs = require('anatomy.probe.inputs')
local Cache = require('anatomy.probe.cache')
local interventions = require('anatomy.probe.interventions')
local hooks = require('anatomy.probe.hooks')
local scope = require('anatomy.probe.scope')
local runs = require('anatomy.probe.runs')
local options = require('anatomy.torch.options')
local terminal = require('anatomy.render.terminal')

local patching = {}

-- patching.logit_diff(good, bad, {position = -1, tokenizer}) -> metric:
-- metric(logits[, mask]) is the mean over the batch of logits[good] -
-- logits[bad] (a one-element tensor, which carries the gradient) at the
-- position (1-based; negative from the end), counted among each example's
-- real tokens when a padding mask (B, T) is given (the patching calls pass
-- theirs). good and bad: token ids or one-token texts. bad = nil: the logit
-- of good alone.
function patching.logit_diff(good, bad, opts)
  local where = 'patching.logit_diff'
  opts = options.check(opts, {'position', 'tokenizer'}, where, 2)
  local g = inputs.token_id(good, opts.tokenizer, where, 'good')
  local b = bad ~= nil and inputs.token_id(bad, opts.tokenizer, where, 'bad') or nil
  local position = opts.position or -1
  if type(position) ~= 'number' or position % 1 ~= 0 or position == 0 then
    error(('%s: position must be a non-zero integer (negative from the end), got %s'):format(where, tostring(position)), 2)
  end
  return function(logits, mask)
    local at
    if mask == nil then
      local p = inputs.position(position, logits:size(2), where, 'the logits')
      at = logits:select(2, p)  -- (B, V)
    else  -- each example's own position among its real tokens
      local B, T, V = logits:size(1), logits:size(2), logits:size(3)
      local index = {}
      for b = 1, B do
        local real = {}
        local row = mask[b]:tolist()
        for t = 1, T do if row[t] then real[#real + 1] = t end end
        index[b] = real[inputs.position(position, #real, where, ('example %d (%d real tokens)'):format(b, #real))]
      end
      at = logits:gather(2, torch.tensor(index, {dtype = 'int64', device = logits.device}):view(B, 1, 1):expand(B, 1, V)):squeeze(2)
    end
    local d = at:select(2, g)
    if b then d = d - at:select(2, b) end
    return d:mean()  -- a one-element tensor: patching.attribute takes its gradient; the others read it as a number
  end
end

patching.point = runs.point
patching.Result = runs.Result

-- patching.run(model, clean, corrupt, metric, {over = 'resid_pre', per =
-- 'layer'|'head'|'position'|'head_position', layers, tokenizer}) -> result. clean and
-- corrupt: ids or texts of one shape; metric(logits) -> a number. For each
-- layer of model:layers() (or of `layers`, numbers or names as steer.vector
-- takes them, kept in the model's order: a point that only some layers
-- have, such as an attached SAE's 'resid_post.sae.acts', needs them) and
-- each head or position of it, the corrupt input runs with that part of
-- `over` patched in from the clean run. result.grid (a row per layer
-- patched x columns) holds the metric, as TransformerLens's patching
-- returns it; result.effect the metric less the corrupt run's;
-- result:normalized() the share of the way from corrupt (0) to clean (1),
-- an error when clean and corrupt differ by no more than the metric's noise
-- (result.meaningful, result.why: twice the standard error of clean -
-- corrupt over the examples, result.noise); print(result) shows the shares
-- (or the effect, saying the grid means nothing), result:report(path).
-- per = 'head_position' patches one head at one position a run: a row a
-- (layer, head), a column a position, and result.layer_position_head the
-- (L, T, H) grid of TransformerLens's get_act_patch_attn_head_out_by_pos
-- (over = 'attn.z').
function patching.run(model, clean, corrupt, metric, opts)
  local where = 'patching.run'
  hooks.require_clean(model, where, 2)
  opts = options.check(opts, {'over', 'per', 'layers', 'tokenizer', 'padding_side', 'attention_mask'}, where, 2)
  if type(metric) ~= 'function' then error(('%s: metric must be a function(logits) -> number, got %s'):format(where, type(metric)), 2) end
  local over, per = opts.over or 'resid_pre', opts.per or 'layer'
  if per ~= 'layer' and per ~= 'head' and per ~= 'position' and per ~= 'head_position' then
    error(("%s: per must be 'layer', 'head', 'position' or 'head_position', got '%s'"):format(where, tostring(per)), 2)
  end
  local clean_ids, corrupt_ids, mask = runs.id_pair(model, clean, corrupt, opts, where)
  local names, rows = runs.layer_points(model, over, where, opts.layers)
  local clean_out, cache = Cache.run_with_cache(model, clean_ids, {filter = names, attention_mask = mask})
  local function run_corrupt() return torch.no_grad(function() return inputs.forward(model, corrupt_ids, mask, where) end) end
  local clean_metric = runs.as_number(metric(clean_out, mask), where)
  local corrupt_out = run_corrupt()
  local corrupt_metric = runs.as_number(metric(corrupt_out, mask), where)
  local noise, examples = runs.spread(metric, clean_out, corrupt_out, mask, where)
  local first = cache:get(names[1])
  if first == nil then error(("%s: the clean run published nothing at '%s'"):format(where, names[1]), 2) end
  local cols, key = {'all'}, nil
  local layout = points.layout(model, names[1])
  local function positions()
    local out, tokens = {}, cache.tokens[1]
    for t = 1, first:size(layout.pos) do out[t] = ('%d %s'):format(t, terminal.token_label(tokens[t] or '', 8)) end
    return out
  end
  if (per == 'head' or per == 'head_position') and not layout.head then
    error(("%s: per = '%s' needs a point with heads (attn.q, k, v, z, result, pattern, scores), got '%s'"):format(where, per, over), 2)
  end
  if per == 'head' then
    cols, key = {}, 'head'
    for h = 1, first:size(layout.head) do cols[h] = 'head ' .. h end
  elseif per == 'position' then
    cols, key = positions(), 'position'
  elseif per == 'head_position' then
    cols = positions()
  end
  local function patched(name, selection)
    local out = scope.run(model, function()
      interventions.patch(model, name, cache, selection)
      return run_corrupt()
    end)
    return runs.as_number(metric(out, mask), where)
  end
  local grid, row_names = {}, rows
  if per == 'head_position' then  -- a row a (layer, head), a column a position
    row_names = {}
    local H = first:size(layout.head)
    for i, name in ipairs(names) do
      for h = 1, H do
        local row = {}
        for c = 1, #cols do row[c] = patched(name, {head = h, position = c}) end
        grid[#grid + 1], row_names[#row_names + 1] = row, ('%s head %d'):format(rows[i], h)
      end
    end
  else
    for i, name in ipairs(names) do
      grid[i] = {}
      for c = 1, #cols do grid[i][c] = patched(name, key and {[key] = c} or nil) end
    end
  end
  local t = torch.tensor(grid, {device = 'cpu', dtype = 'float64'})
  local r = runs.result{grid = t, values = grid, effect = t - corrupt_metric, rows = row_names, points = names, cols = cols,
    over = over, per = per, clean = clean_metric, corrupt = corrupt_metric, noise = noise, examples = examples}
  if per == 'head_position' then
    -- TransformerLens's layout of get_act_patch_attn_head_out_by_pos: (layer, position, head)
    r.layer_position_head = t:reshape(#names, -1, #cols):permute(1, 3, 2):contiguous()
  end
  return r
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
  hooks.require_clean(model, where, 2)
  opts = options.check(opts, {'sender', 'receivers', 'via', 'tokenizer', 'padding_side', 'attention_mask'}, where, 2)
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
  local clean_ids, corrupt_ids, mask = runs.id_pair(model, clean, corrupt, opts, where)
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
  local clean_out, clean_cache = Cache.run_with_cache(model, clean_ids, {filter = z_names, attention_mask = mask})
  local corrupt_out, corrupt_cache = Cache.run_with_cache(model, corrupt_ids, {filter = z_names, attention_mask = mask})
  local layout = points.layout(model, z_names[1])
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
  -- step 2 records the receivers' inputs; step 3 is the corrupt run with
  -- those inputs, nothing else. Each step's hooks go when it ends, after an
  -- error too.
  local step2 = select(2, scope.run(model, function()
    for i, name in ipairs(z_names) do
      local frozen, from_clean = corrupt_cache[name], clean_cache[name]
      local heads = by_layer[i]
      hooks.replace(model, name, function()
        local out = frozen:clone()
        for _, h in ipairs(heads or {}) do out:narrow(layout.head, h, 1):copy_(from_clean:narrow(layout.head, h, 1)) end
        return out
      end)
    end
    return Cache.run_with_cache(model, corrupt_ids, {filter = receiver_names, attention_mask = mask})
  end))
  local out = scope.run(model, function()
    for i, r in ipairs(receivers) do
      local key = via ~= 'resid' and {head = r[2]} or nil
      local patched_ok, err = pcall(interventions.patch, model, receiver_names[i], step2, key)
      if not patched_ok then error(('%s: receivers[%d]: %s'):format(where, i, tostring(err):gsub('^[^\n]-:%d+: ', '')), 0) end
    end
    return torch.no_grad(function() return inputs.forward(model, corrupt_ids, mask, where) end)
  end)
  local describe = {}
  for i, s in ipairs(senders) do describe[i] = ('%s head %d'):format(s[1], s[2]) end
  local into = {}
  for i, r in ipairs(receivers) do into[i] = r[2] and ('%s head %d'):format(r[1], r[2]) or r[1] end
  return setmetatable({value = runs.as_number(metric(out, mask), where), clean = runs.as_number(metric(clean_out, mask), where),
    corrupt = runs.as_number(metric(corrupt_out, mask), where), senders = describe, receivers = into, via = via}, PathResult)
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

-- the estimates from gradients: attribution patching (attribute.lua) and edge attribution (edges.lua)
patching.attribute = require('anatomy.probe.attribute').attribute
patching.edges = require('anatomy.probe.edges').edges

hooks.analysis(patching.run)
hooks.analysis(patching.path)

return patching
