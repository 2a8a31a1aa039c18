-- The autopsy as one self-contained HTML file: the provenance line, the
-- per-layer table and inline SVG charts (anatomy/charts.lua); no scripts, nothing
-- fetched from the network.
local svg = require 'anatomy.charts'
local format = require 'anatomy.autopsy.format'
local report = {}

local esc = svg.esc

-- The legend under the table: each column's one name and what it measures
-- (format.measures, as the terminal prints it), then the verdicts' rule.
local function legend_html(a)
  local out = {}
  for _, m in ipairs(format.measures) do out[#out + 1] = ('<dt>%s</dt><dd>%s</dd>'):format(esc(m[1]), esc(m[2])) end
  local lines = format.legend(a)
  out[#out + 1] = '<dt>verdicts</dt><dd>' .. esc((lines[#lines]:gsub('^verdicts: ', ''))) .. '</dd>'
  return table.concat(out)
end

-- The run's provenance at the top: one labelled line each (provenance.fields).
local function provenance_html(rec)
  local out = {'<dl class="provenance">'}
  for _, f in ipairs(require('anatomy.provenance').fields(rec)) do
    out[#out + 1] = ('<dt>%s</dt><dd>%s</dd>'):format(esc(f[1]), esc(f[2]))
  end
  out[#out + 1] = '</dl>'
  return table.concat(out)
end

local style = [[
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; max-width: 1200px; }
h1 { font-size: 20px; } table { border-collapse: collapse; font: 12px monospace; }
td, th { padding: 2px 8px; border-bottom: 1px solid #ddd; text-align: right; } td:first-child, th:first-child { text-align: left; }
.passenger { color: #888; } .boundary { color: #d62728; font-weight: bold; } .exploding { color: #ff7f0e; font-weight: bold; }
.charts { display: flex; flex-wrap: wrap; gap: 16px; } figure { margin: 0; border: 1px solid #eee; padding: 8px; }
figcaption { font-weight: bold; margin-bottom: 4px; } .axis { stroke: #999; } .tick, .label, .label-left { font-size: 10px; fill: #555; } .legend { font-size: 11px; }
.label { text-anchor: middle; } .note { font-size: 11px; color: #666; max-width: 560px; }
dl.note { display: grid; grid-template-columns: max-content 1fr; gap: 0 12px; max-width: 900px; }
dl.note dt { font-family: monospace; } dl.note dd { margin: 0; }
.provenance { font-size: 12px; color: #444; background: #f6f6f6; padding: 6px 8px; display: grid;
  grid-template-columns: max-content 1fr; gap: 0 12px; } .provenance dt { font-weight: bold; } .provenance dd { margin: 0; }
]]

-- report.page(title, body) -> a self-contained HTML page in the report's
-- style (patching and attribution results use it)
function report.page(title, body)
  return table.concat({'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>', esc(title), '</title>',
    '<style>', style, '</style></head><body><h1>', esc(title), '</h1>', body, '</body></html>\n'})
end

-- report.html(a) -> the report as a string
function report.html(a)
  local rows, labels = a.rows, {}
  local blocks = {}
  for _, r in ipairs(rows) do
    labels[#labels + 1] = r.name
    if r.kind == 'block' then blocks[#blocks + 1] = r end
  end
  local function column(list, key) local out = {} for i, r in ipairs(list) do out[i] = r[key] end return out end
  local block_names = column(blocks, 'name')
  local charts = {}
  local h = a.history
  if h and h.train and #h.train > 0 then
    local xs = {}
    for i = 1, #h.train do xs[i] = (h.first_step or 1) + i - 1 end
    local vx, vy = {}, {}
    for i, v in ipairs(h.val or {}) do vx[i], vy[i] = v.step, v.loss end
    charts[#charts + 1] = svg.lines('Loss (train, val)', {{'train', xs, h.train}, {'val', vx, vy}})
  end
  if h and h.probes and #h.probes > 0 then
    local params, steps, matrix = {}, {}, {}
    for _, p in ipairs(a.params) do params[#params + 1] = p.name end
    for j, rec in ipairs(h.probes) do steps[j] = tostring(rec.step) end
    for i, name in ipairs(params) do
      matrix[i] = {}
      for j, rec in ipairs(h.probes) do matrix[i][j] = rec.grad_norm[name] end
    end
    charts[#charts + 1] = svg.heatmap('Gradient norm: parameter x step (log colour)', params, steps, matrix, true)
    local series = {}
    for _, name in ipairs(block_names) do
      local xs, ys = {}, {}
      for j, rec in ipairs(h.probes) do xs[j], ys[j] = rec.step, rec.act_std[name] end
      series[#series + 1] = {name, xs, ys}
    end
    charts[#charts + 1] = svg.lines('Activation std of each layer over training', series)
  end
  charts[#charts + 1] = svg.bars('Gradient norm per row', labels, column(rows, 'grad_norm'))
  charts[#charts + 1] = svg.bars('Effective rank per layer (the funnel)', block_names, column(blocks, 'erank'))
  if #a.weights > 0 then
    charts[#charts + 1] = svg.bars('Effective rank of each weight / its full rank', column(a.weights, 'name'), column(a.weights, 'ratio'))
  end
  charts[#charts + 1] = svg.bars('Attention entropy per layer (nats)', block_names, column(blocks, 'entropy'))
  if a.entropy_heads then
    local heads, matrix = {}, {}
    for i, r in ipairs(blocks) do matrix[i] = a.entropy_heads[r.name] or {} end
    for k = 1, #(matrix[1] or {}) do heads[k] = 'head ' .. k end
    if #heads > 0 then charts[#charts + 1] = svg.heatmap('Attention entropy: layer x head', block_names, heads, matrix, false) end
  end
  charts[#charts + 1] = svg.bars('Activation std per layer', block_names, column(blocks, 'act_std'))
  charts[#charts + 1] = svg.bars('Logit lens: loss read out after each layer', block_names, column(blocks, 'lens_loss'))
  charts[#charts + 1] = svg.bars('Loss with each layer removed', block_names, column(blocks, 'removal_loss'),
    ('full model: %s'):format(format.number(a.loss, 4)))
  if a.patterns then
    local names, mats = {}, {}
    for _, r in ipairs(blocks) do
      if a.patterns[r.name] then names[#names + 1] = r.name:match('[^.]*$'); mats[#mats + 1] = a.patterns[r.name] end
    end
    if #mats > 0 then
      local title = a.patterns_text and ('Attention patterns (first head) for "%s"'):format(a.patterns_text:sub(1, 40))
        or 'Attention patterns (first head) for a validation window'
      charts[#charts + 1] = svg.thumbnails(title, names, mats)
    end
  end

  -- every head's attention map, the tokens on both axes (up to 8 heads a layer)
  local head_maps = {}
  if a.attention_maps and a.attention_tokens then
    for _, r in ipairs(blocks) do
      local m = a.attention_maps[r.name]
      if m then
        for h = 1, math.min(m:size(1), 8) do
          head_maps[#head_maps + 1] = svg.attention_map(('%s head %d'):format(r.name, h), a.attention_tokens, m[h]:tolist())
        end
      end
    end
  end

  local cols = {'name'}
  for _, m in ipairs(format.measures) do cols[#cols + 1] = m[1] end
  local thead = {}
  for _, c in ipairs(cols) do thead[#thead + 1] = '<th>' .. c .. '</th>' end
  local tbody = {}
  for _, r in ipairs(rows) do
    local tds = {}
    for _, c in ipairs(cols) do
      local v = r[c]
      tds[#tds + 1] = '<td>' .. esc(type(v) == 'number' and format.number(v) or (v or '')) .. '</td>'
    end
    tbody[#tbody + 1] = ('<tr class="%s">%s</tr>'):format(r.verdict or '', table.concat(tds))
  end
  return table.concat({
    '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>autopsy of ', esc(a.model), '</title>',
    '<style>', style, '</style></head><body>',
    '<h1>Autopsy of ', esc(a.model), '</h1><p>loss ', format.number(a.loss, 4), '</p>',
    a.provenance and provenance_html(a.provenance) or '',
    '<table><thead><tr>', table.concat(thead), '</tr></thead><tbody>', table.concat(tbody), '</tbody></table>',
    '<dl class="note">', legend_html(a), '</dl>',
    '<div class="charts">', table.concat(charts), '</div>',
    a.sections and ('<h2>Patching and attribution</h2><div class="charts">' .. table.concat(a.sections) .. '</div>') or '',
    #head_maps > 0 and ('<h2>Attention maps' .. (a.patterns_text and (' for "' .. esc(a.patterns_text:sub(1, 60)) .. '"') or
      ' for the first sequence') .. '</h2><div class="charts">' .. table.concat(head_maps) .. '</div>') or '',
    '</body></html>\n'})
end

return report
