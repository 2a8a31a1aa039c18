-- Autopsy: the result of autopsy.run, a value: printable as the per-layer
-- table (text.lua), savable as JSON, renderable as an HTML report
-- (report.lua). Its methods are all here; the work is in those files, and
-- which measures each output shows is the registry's (measures.lua).
local models = require('anatomy.models')
local fs = require('anatomy.io.fs')
local text = require('anatomy.autopsy.text')
local measures = require('anatomy.autopsy.measures')
local charts = require('anatomy.render.charts')
local figure = require('anatomy.render.figure')
local report = require('anatomy.autopsy.report')
local options = require('anatomy.torch.options')
local export = require('anatomy.io.export')
local result = require('anatomy.render.result')

local Autopsy = {}
Autopsy.__index = Autopsy

-- The per-layer table, the verdicts' rule, and each parameter's |grad| and rank.
function Autopsy:__tostring() return text.table(self) end

-- Each parameter's gradient norm and, for matrices, its effective rank.
function Autopsy:parameter_table() return text.parameter_table(self) end

-- a:plot(metric): a compact chart of one column per layer, in the terminal
-- ('grad_norm', 'erank', 'entropy', 'diag', 'act_std', 'amplification', 'residual',
-- 'influence', 'lens_loss', 'removal_loss'; with a tuned lens 'lens_kl',
-- 'tuned_lens_loss', 'tuned_kl'; every one is autopsy.measures.where('plot')).
function Autopsy:plot(metric)
  local out = text.plot(self, metric)  -- not a tail call: errors name the caller's line
  return out
end

-- a:chart(metric) -> a Figure of one column per layer (the metrics of
-- a:plot): it prints as a:plot does, shows as SVG in a notebook, and
-- fig:save('chart.svg') writes it.
function Autopsy:chart(metric)
  local terminal = text.plot(self, metric, true)
  metric = metric or 'grad_norm'
  local labels, values = {}, {}
  for i, r in ipairs(self.rows) do labels[i], values[i] = r.name, r[metric] or 0 / 0 end
  local title = ('%s per layer'):format(metric)
  return figure.new(title, charts.bars(title, labels, values, {ylabel = metric, xlabel = 'row'}), terminal)
end

-- a:html() -> the HTML report as a string (the table, the charts); a:report(path)
-- writes it, and a notebook shows it (render/result.lua)
function Autopsy:html() return report.html(self) end

-- a:attention(layer, head, {numbers = false}) -> a figure: that head's attention
-- map for the first sequence (the probe text when autopsy.run had one; up
-- to 32 tokens), the tokens on both axes. It prints as text (numbers = true:
-- the weights) and shows in a notebook as a heatmap. layer: its number or name.
function Autopsy:attention(layer, head, opts)
  opts = options.check(opts, {'numbers'}, 'a:attention', 2)
  local names = {}
  for _, r in ipairs(self.rows) do
    if r.kind == 'block' and self.attention_maps[r.name] then names[#names + 1] = r.name end
  end
  if #names == 0 then error('a:attention: no layer published an attention pattern in this autopsy', 2) end
  local name = type(layer) == 'number' and names[layer] or layer
  for _, r in ipairs(self.rows) do  -- a checkpoint's own spelling ('transformer.h.0') names its row too
    if r.hf_name and r.hf_name == layer then name = r.name end
  end
  if type(name) == 'string' and not self.attention_maps[name] and name:find('%f[%w]0%f[%W]') then
    for _, r in ipairs(self.rows) do
      if r.hf_name and models.hf_name(r.name) == name then
        error(("a:attention: '%s': anatomy counts layers from 1, so a layer 0 is no anatomy name: write '%s', or the checkpoint's own name '%s'")
          :format(name, r.name, r.hf_name), 2)
      end
    end
  end
  local m = self.attention_maps[name]
  if not m then
    error(('a:attention: layer must be 1..%d or one of %s, got %s'):format(#names, table.concat(names, ', '), tostring(layer)), 2)
  end
  if type(head) ~= 'number' or head % 1 ~= 0 or head < 1 or head > m:size(1) then
    error(('a:attention: head must be in 1..%d, got %s'):format(m:size(1), tostring(head)), 2)
  end
  local title = ('%s head %d'):format(name, head)
  return figure.attention(title, self.attention_tokens, m[head], opts.numbers)
end

-- a:add(result): a result with an svg() method (patching.run's,
-- probe.logit_attribution's) drawn in the report after the autopsy's own
-- charts; returns a.
function Autopsy:add(result)
  if type(result) ~= 'table' or type(result.svg) ~= 'function' then
    error(('a:add: expected a result with an svg() method (patching.run, probe.logit_attribution), got %s'):format(type(result)), 2)
  end
  local sections = rawget(self, 'sections') or {}
  sections[#sections + 1] = result:svg()
  rawset(self, 'sections', sections)
  return self
end

-- The autopsy as plain data (what json() writes).
function Autopsy:data()
  local rows = {}
  for i, r in ipairs(self.rows) do
    local copy = {}
    for k, v in pairs(r) do if k ~= 'grads' then copy[k] = v end end
    rows[i] = copy
  end
  return {provenance = self.provenance, model = self.model, loss = self.loss, rows = rows, params = self.params, weights = self.weights,
    removal = self.removal, moe = self.moe, thresholds = self.thresholds, missing = self.missing,
    entropy_heads = self.entropy_heads, patterns = self.patterns,
    history = self.history and {train = self.history.train, val = self.history.val, probes = self.history.probes,
      first_step = self.history.first_step} or nil}
end

-- The per-layer measures, in the names the JSON uses, in table order: the
-- registry's csv ones after what a row is (name, kind).
Autopsy.columns = {unpack(measures.identity)}
for _, name in ipairs(measures.where('csv', true)) do Autopsy.columns[#Autopsy.columns + 1] = name end

-- a's CSV columns: Autopsy.columns, and each csv = 'present' measure in the
-- registry's order where a row has it (a model with an nn.MoE: its experts')
local function columns_of(a)
  local out, present = {unpack(Autopsy.columns)}, {}
  for _, m in ipairs(measures.rows) do
    for _, r in ipairs(m.csv == 'present' and a.rows or {}) do present[m.name] = present[m.name] or r[m.name] ~= nil end
  end
  if not next(present) then return out end
  out = {unpack(measures.identity)}
  for _, m in ipairs(measures.rows) do if m.csv == true or present[m.name] then out[#out + 1] = m.name end end
  return out
end

-- a:csv(path): the per-layer table as CSV (one row a layer, the JSON's
-- names as columns); returns path
function Autopsy:csv(path)
  if type(path) ~= 'string' or path == '' then error(('a:csv: path must be a file path, got %s'):format(type(path)), 2) end
  fs.mkdir(fs.dirname(path))
  return export.csv(path, self:data().rows, columns_of(self))
end

-- a:tensorboard(dir): the per-layer measures as TensorBoard scalars
-- (autopsy/<measure>, the layer's position as the step: TensorBoard's curves
-- then read as depth profiles), the loss, and the training history when the
-- autopsy has one (train/loss, val/loss by step); returns the file's path
function Autopsy:tensorboard(dir)
  if type(dir) ~= 'string' or dir == '' then error(('a:tensorboard: dir must be a folder path, got %s'):format(type(dir)), 2) end
  local scalars = {}
  local depth = 0
  for _, r in ipairs(self.rows) do
    depth = depth + 1
    for _, key in ipairs(columns_of(self)) do
      local v = r[key]
      if type(v) == 'number' and v == v then scalars[#scalars + 1] = {tag = 'autopsy/' .. key, step = depth, value = v} end
    end
  end
  if type(self.loss) == 'number' then scalars[#scalars + 1] = {tag = 'autopsy/loss', step = 0, value = self.loss} end
  local h = self.history
  if h then
    for i, v in ipairs(h.train or {}) do scalars[#scalars + 1] = {tag = 'train/loss', step = (h.first_step or 1) + i - 1, value = v} end
    for _, v in ipairs(h.val or {}) do scalars[#scalars + 1] = {tag = 'val/loss', step = v.step, value = v.loss} end
  end
  fs.mkdir(dir)
  return export.tensorboard(dir, scalars)
end

-- a:json(path) (a:data() as JSON), a:report(path) (a:html()) and the
-- notebook's view: the protocol every result shares
result.outputs(Autopsy, 'a')

return Autopsy
