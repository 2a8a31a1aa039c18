-- runs: what the patching calls share (patching.lua, attribute.lua,
-- edges.lua): the clean and corrupt ids, the point a name means in each
-- layer, the metric read as a number or as a tensor that carries the
-- gradient, and the grid of results with its print, chart and page.
local torch = require('anatomy.torch')
local points = require('anatomy.probe.points')
local inputs = require('anatomy.probe.inputs')
local terminal = require('anatomy.render.terminal')
local charts = require('anatomy.render.charts')
local page = require('anatomy.render.page')
local result = require('anatomy.render.result')
local format = require('anatomy.render.format')

local runs = {}

-- runs.point(model, layer, over[, index]) -> the point `over` names in the
-- layer at path `layer` (index: its place in model:layers(), found when not
-- given). over is a point within each layer, in any spelling:
-- '<layer>.<over>' when that is a probe point ('resid_pre', 'attn.z');
-- TransformerLens's relative name ('attn.hook_z', 'hook_resid_pre',
-- 'hook_attn_out') with the layer counted as TransformerLens counts it;
-- else a role and a rest ('attn.z', 'mlp.post', 'ln1.scale') or a role
-- alone ('attn', 'mlp', 'ln1', 'ln2': that child's output), the role being
-- the layer's attention (the child publishing z), MLP (publishing post) or
-- first or second norm under whatever name the family gives it, so 'attn'
-- reaches Llama's self_attn and GPT-NeoX's attention too. A whole name of
-- one layer's point ('blocks.0.attn.hook_z', 'h.1.attn.z') is an error that
-- says what to write.
function runs.point(model, layer, over, index)
  if type(over) ~= 'string' then error(('over must be the name of a point within each layer, got %s'):format(type(over)), 0) end
  local all = model:layers() or {}
  if not index then
    for i, l in ipairs(all) do if l[1] == layer then index = i end end
  end
  local tl_layer = over:match('^blocks%.(%d+)%.') or over:match('^blocks%.(%d+)$')
  local one = tl_layer and over:find('hook_', 1, true) and tonumber(tl_layer) + 1
  local rest
  for i, l in ipairs(all) do
    if over == l[1] or over:sub(1, #l[1] + 1) == l[1] .. '.' then one, rest = i, over:sub(#l[1] + 2) end
  end
  local resolved = not one and not over:find('hook_', 1, true) and select(2, pcall(points.resolve_name, model, over, 1))
  if type(resolved) == 'string' and resolved ~= over then  -- a checkpoint's name of a layer's part
    for i, l in ipairs(all) do
      if resolved == l[1] or resolved:sub(1, #l[1] + 1) == l[1] .. '.' then one, rest = i, resolved:sub(#l[1] + 2) end
    end
  end
  if one then
    rest = rest or over:gsub('^blocks%.%d+%.?', '')
    error(("over = '%s' names one layer's point; over is the point within each layer (here '%s'), "
      .. "and layers = {%d} keeps that layer alone (layers count from 1)"):format(over, rest ~= '' and rest or 'its output', one), 0)
  end
  if over:find('hook_', 1, true) then
    if not index then error(("'%s' is not a layer of the model"):format(layer), 0) end
    local ok, name = pcall(points.from_transformer_lens, model, ('blocks.%d.%s'):format(index - 1, over), 1)
    if not ok then error((tostring(name):gsub('^[^:]*:%d+: ', '')), 0) end
    return name
  end
  local name = layer .. '.' .. over
  if pcall(points.locate, model, name, 1) then return name end
  local role, tail = over:match('^(%w+)%.(.+)$')
  role = role or over
  local block
  for n, m in model:named_modules() do if n == layer then block = m end end
  if block and (role == 'attn' or role == 'mlp' or role == 'ln1' or role == 'ln2') then
    local child = points.role_child(block, role)
    if child then
      local candidate = layer .. '.' .. child .. (tail and ('.' .. tail) or '')
      if pcall(points.locate, model, candidate, 1) then return candidate end
    end
  end
  local _, err = pcall(points.locate, model, name, 1)
  error(err, 0)
end

-- runs.id_pair(model, clean, corrupt, opts, where) -> the clean and
-- corrupt ids of a patching call and their padding mask (nil without
-- padding): of one shape, and, padded (examples of different lengths,
-- opts.padding_side, or ids with opts.attention_mask), each clean example
-- as long as its corrupt one, so that one mask serves both (an error at the
-- caller's caller otherwise).
function runs.id_pair(model, clean, corrupt, opts, where)
  local clean_ids, _, clean_mask = inputs.to_ids(model, clean, opts.tokenizer, where, opts.padding_side)
  local corrupt_ids, _, corrupt_mask = inputs.to_ids(model, corrupt, opts.tokenizer, where, opts.padding_side)
  if format.shape(clean_ids) ~= format.shape(corrupt_ids) then
    error(('%s: clean is %s tokens and corrupt %s; they must have one shape'):format(where, format.shape(clean_ids),
      format.shape(corrupt_ids)), 3)
  end
  if opts.attention_mask ~= nil then
    if clean_mask or corrupt_mask then error(('%s: attention_mask is for ids; the input was padded here already'):format(where), 3) end
    clean_mask = inputs.check_mask(clean_ids, opts.attention_mask, where)
    corrupt_mask = clean_mask
  end
  if (clean_mask == nil) ~= (corrupt_mask == nil) or (clean_mask and not torch.equal(clean_mask, corrupt_mask)) then
    local function lengths(m, ids)
      local out = {}
      for b = 1, ids:size(1) do out[b] = m and m[b]:sum():item() or ids:size(2) end
      return out
    end
    local a, b = lengths(clean_mask, clean_ids), lengths(corrupt_mask, corrupt_ids)
    for i = 1, #a do
      if a[i] ~= b[i] then
        error(('%s: clean[%d] is %d tokens and corrupt[%d] %d; each clean example must be as long as its corrupt one'):format(
          where, i, a[i], i, b[i]), 3)
      end
    end
  end
  return clean_ids, corrupt_ids, clean_mask
end

-- runs.layer_points(model, over, where, layers) -> the point `over` names in
-- each chosen layer of model:layers() (layers: nil for every layer, or as
-- points.pick_layers takes them): names, and the layers' names (the grid's
-- rows). A point that only some layers have (an SAE's features) is an error
-- that says to choose those layers.
function runs.layer_points(model, over, where, layers)
  local chosen, all = points.pick_layers(model, layers, where, 3)
  local names, rows, failed = {}, {}, nil
  for i, index in ipairs(chosen) do
    local l = all[index]
    local ok, name = pcall(runs.point, model, l[1], over, index)
    if ok then names[#names + 1], rows[#rows + 1] = name, l[1] else failed = failed or name end
  end
  if failed then
    local hint = #names > 0 and layers == nil and (' (only some layers have it: choose them with {layers = ...})') or ''
    error(('%s: %s%s'):format(where, failed, hint), 3)
  end
  return names, rows
end

function runs.as_number(v, where)
  if torch.is_tensor(v) then
    if v:numel() ~= 1 then error(('%s: the metric returned a tensor of %d values; it must return one number'):format(where, v:numel()), 0) end
    v = v:item()
  end
  if type(v) ~= 'number' then error(('%s: the metric returned a %s; it must return a number'):format(where, type(v)), 0) end
  return v
end

-- The metric of a run as a scalar tensor that can carry a gradient (a
-- number is refused: attribution needs the graph).
function runs.as_scalar(v, where)
  if not torch.is_tensor(v) or v:numel() ~= 1 then
    error(('%s: the metric must return a one-element tensor that carries the gradient (patching.logit_diff does; '
      .. 'a number, :item(), has none), got %s'):format(where, torch.is_tensor(v) and format.shape(v) or type(v)), 0)
  end
  return v:reshape({})
end

-- runs.spread(metric, clean_out, corrupt_out, mask, where) -> the standard
-- error of the mean of clean - corrupt over the examples (the metric of
-- each example alone; the metrics of patching average over examples), and
-- the number of examples; nil with one example, or a metric that cannot
-- read one example alone.
function runs.spread(metric, clean_out, corrupt_out, mask, where)
  local B = clean_out:size(1)
  if B < 2 then return nil, B end
  local diffs, mean = {}, 0
  for b = 1, B do
    local m = mask and mask:narrow(1, b, 1) or nil
    local ok, d = pcall(function()
      return runs.as_number(metric(clean_out:narrow(1, b, 1):detach(), m), where)
        - runs.as_number(metric(corrupt_out:narrow(1, b, 1):detach(), m), where)
    end)
    if not ok or d ~= d then return nil, B end
    diffs[b], mean = d, mean + d / B
  end
  local var = 0
  for _, d in ipairs(diffs) do var = var + (d - mean) ^ 2 / (B - 1) end
  return math.sqrt(var / B), B
end

-- runs.judge(r): whether clean and corrupt differ by more than the metric's
-- noise, and why: more than twice the standard error of their difference
-- over the examples (r.noise), and more than float32's rounding of the
-- metric (1e-6 of its size). With one example there is no spread to judge
-- from; only the rounding is checked, and the print says so.
function runs.judge(r)
  local d = r.clean - r.corrupt
  local rounding = 1e-6 * (1 + math.abs(r.clean) + math.abs(r.corrupt))
  if d ~= d then return false, 'the metric is NaN' end
  if math.abs(d) <= rounding then
    return false, ('clean and corrupt give the same metric (difference %.3g, within float rounding)'):format(d)
  end
  if r.noise and math.abs(d) <= 2 * r.noise then
    return false, ('clean - corrupt = %.4g is within twice its standard error over the %d examples (%.3g)'):format(d, r.examples, r.noise)
  end
  return true, nil
end

local Result = {}
Result.__index = Result
runs.Result = Result

-- runs.result(fields) -> a Result: fields with grid (the measured metric,
-- or for an estimate the estimated effect), effect (patched - corrupt),
-- clean, corrupt, noise and examples; meaningful and why are added.
function runs.result(r)
  r.difference = r.clean - r.corrupt
  r.meaningful, r.why = runs.judge(r)
  return setmetatable(r, Result)
end

-- result:normalized() -> effect / (clean - corrupt): 0 where the patch
-- changes nothing, 1 where it restores the clean metric. An error when clean
-- and corrupt differ by no more than the metric's noise (runs.judge):
-- shares of that difference would be noise; result.effect is still there.
function Result:normalized()
  if not self.meaningful then
    error(('patching: no normalized result: %s; read result.effect (patched - corrupt) instead'):format(self.why), 2)
  end
  return self.effect / self.difference
end

-- What the grid holds: activation patching's measured metric, or the
-- estimate of the effect (patching.attribute's method, with its steps).
local function kind(r)
  if not r.method then return 'activation patching', 'patched from the clean run' end
  local m = r.method .. (r.steps and (', %d steps'):format(r.steps) or '')
  return ('attribution patching (%s)'):format(m), 'patched from the clean run, estimated from gradients'
end

-- What print, the chart and the page show, from one computation: the share
-- of clean - corrupt each patch restores where that difference is more than
-- noise, else the effect itself (patched - corrupt); the caption's lines.
local function shown(self)
  local name, how = kind(self)
  local values, what
  if self.meaningful then
    values, what = (self.effect / self.difference):tolist(), 'share of clean - corrupt restored (0: none, 1: all)'
  else
    values, what = self.effect:tolist(), 'effect: patched - corrupt (not normalized)'
  end
  local spread = self.noise and (' ± %.3g (standard error over %d examples)'):format(self.noise, self.examples)
    or (' (one example: no spread to judge the noise by)')
  local lines = {('clean %.6g, corrupt %.6g: clean - corrupt = %.4g%s'):format(self.clean, self.corrupt, self.difference, spread)}
  if not self.meaningful then
    lines[#lines + 1] = ('NOT MEANINGFUL: %s, so no cell can mean anything beyond noise'):format(self.why)
  end
  return values, ('%s of %s per %s, each part %s: %s'):format(name, self.over, self.per, how, what), lines
end
runs.shown = shown

function Result:__tostring()
  local values, title, lines = shown(self)
  return table.concat(lines, '\n') .. '\n' .. terminal.heatmap(title, self.rows, self.cols, values, '%.4f')
end

-- result:svg() -> the grid as a labelled heatmap (charts.heatmap), the same values print shows
function Result:svg()
  local values, title, lines = shown(self)
  return charts.heatmap(title:gsub('^%l', string.upper), self.rows, self.cols, values, false, table.concat(lines, '; '))
end

-- result:report(path) -> path: a self-contained HTML page with the heatmap
-- and the grid as a table (written atomically)
function Result:report(path)
  local esc = charts.esc
  local values, title, lines = shown(self)
  local head = {'<tr><th>layer</th>'}
  for _, c in ipairs(self.cols) do head[#head + 1] = '<th>' .. esc(c) .. '</th>' end
  local body = {}
  for i, r in ipairs(self.rows) do
    local tds = {'<tr><td>' .. esc(r) .. '</td>'}
    for _, v in ipairs(values[i]) do tds[#tds + 1] = ('<td>%.4f</td>'):format(v) end
    body[#body + 1] = table.concat(tds) .. '</tr>'
  end
  local html = page.new((kind(self):gsub('^%l', string.upper)), '<p>' .. esc(title) .. '</p><p>' .. esc(table.concat(lines, ' ')) .. '</p>'
    .. self:svg() .. '<table><thead>' .. table.concat(head) .. '</tr></thead><tbody>' .. table.concat(body) .. '</tbody></table>')
  local written = result.write(path, html, 'result:report')  -- render/result.lua: checked, its folder made, atomic
  return written
end

return runs
