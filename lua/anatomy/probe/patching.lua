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
local options = require('anatomy.torch.options')
local terminal = require('anatomy.render.terminal')
local charts = require('anatomy.render.charts')
local page = require('anatomy.render.page')
local fs = require('anatomy.io.fs')
local format = require('anatomy.render.format')

local patching = {}


-- patching.logit_diff(good, bad, {position = -1, tokenizer}) -> metric:
-- metric(logits) is the mean over the batch of logits[good] - logits[bad] at
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
    return d:mean():item()
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
  local clean_ids = inputs.to_ids(model, clean, opts.tokenizer, where)
  local corrupt_ids, tok = inputs.to_ids(model, corrupt, opts.tokenizer, where)
  if format.shape(clean_ids) ~= format.shape(corrupt_ids) then
    error(('%s: clean is %s tokens and corrupt %s; they must have one shape'):format(where, format.shape(clean_ids),
      format.shape(corrupt_ids)), 2)
  end
  local layers, why = model:layers()
  if not layers then error(('%s: %s'):format(where, why), 2) end
  local names, rows = {}, {}
  for i, l in ipairs(layers) do
    local ok, name = pcall(patching.point, model, l[1], over)
    if not ok then error(('%s: %s'):format(where, name), 2) end
    names[i], rows[i] = name, l[1]
  end
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
