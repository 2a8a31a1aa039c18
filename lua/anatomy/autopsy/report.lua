-- The autopsy as one self-contained HTML file: the provenance line, the
-- per-layer table and inline SVG charts (anatomy/render/charts.lua); no scripts, nothing
-- fetched from the network.
local svg = require('anatomy.render.charts')
local format = require('anatomy.render.format')
local page = require('anatomy.render.page')
local text = require('anatomy.autopsy.text')
local measures = require('anatomy.autopsy.measures')
local moe = require('anatomy.autopsy.moe')
local report = {}

local esc = svg.esc

-- The legend under the table: each column's one name and what it measures
-- (the registry's meanings, as the terminal prints them), then the verdicts' rule.
local function legend_html(a)
  local out = {}
  for _, m in ipairs(text.columns(a)) do out[#out + 1] = ('<dt>%s</dt><dd>%s</dd>'):format(esc(m.name), esc(m.meaning)) end
  local lines, experts = text.legend(a), text.expert_rule(a)
  out[#out + 1] = '<dt>verdicts</dt><dd>' .. esc((lines[#lines - (experts and 1 or 0)]:gsub('^verdicts: ', ''))) .. '</dd>'
  if experts then out[#out + 1] = '<dt>expert verdicts</dt><dd>' .. esc((experts:gsub('^expert verdicts %(a.moe.experts%): ', ''))) .. '</dd>' end
  return table.concat(out)
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
    charts[#charts + 1] = svg.lines('Loss during training', {{'train', xs, h.train}, {'val', vx, vy}}, {ylabel = 'loss (nats)'})
  end
  if h and h.probes and #h.probes > 0 then
    local params, steps, matrix = {}, {}, {}
    for _, p in ipairs(a.params) do params[#params + 1] = p.name end
    for j, rec in ipairs(h.probes) do steps[j] = tostring(rec.step) end
    for i, name in ipairs(params) do
      matrix[i] = {}
      for j, rec in ipairs(h.probes) do matrix[i][j] = rec.grad_norm[name] end
    end
    charts[#charts + 1] = svg.heatmap('Gradient norm of each parameter over training', params, steps, matrix, true,
      {xlabel = 'step', ylabel = 'parameter', value = 'grad_norm (log colour)'})
    local series = {}
    for _, name in ipairs(block_names) do
      local xs, ys = {}, {}
      for j, rec in ipairs(h.probes) do xs[j], ys[j] = rec.step, rec.act_std[name] end
      series[#series + 1] = {name, xs, ys}
    end
    charts[#charts + 1] = svg.lines('act_std of each layer over training', series, {ylabel = 'act_std'})
  end
  -- the charts beside a measure's own: the weights' ranks after erank, each
  -- head's entropy after entropy, the tuned lens's after lens_loss
  local beside = {}
  function beside.erank()
    if #a.weights > 0 then
      charts[#charts + 1] = svg.bars('erank of each weight matrix, as a share of its full rank', column(a.weights, 'name'),
        column(a.weights, 'ratio'), {ylabel = 'erank / full rank', xlabel = 'parameter'})
    end
  end
  function beside.entropy()
    if not a.entropy_heads then return end
    local heads, matrix = {}, {}
    for i, r in ipairs(blocks) do matrix[i] = a.entropy_heads[r.name] or {} end
    for k = 1, #(matrix[1] or {}) do heads[k] = 'head ' .. k end
    if #heads > 0 then
      charts[#charts + 1] = svg.heatmap('entropy: layer x head', block_names, heads, matrix, false,
        {xlabel = 'head', ylabel = 'layer', value = 'entropy (nats)'})
    end
  end
  function beside.lens_loss()
    -- with a tuned lens: both lenses' KL to the final distribution and their losses, layer by layer
    local tuned_rows = {}
    for i, r in ipairs(blocks) do if r.tuned_kl then tuned_rows[#tuned_rows + 1] = i end end
    if #tuned_rows == 0 then return end
    local xs, names = {}, {}
    for k, i in ipairs(tuned_rows) do xs[k], names[i] = i, blocks[i].name end
    local function ys(key) local out = {} for k, i in ipairs(tuned_rows) do out[k] = blocks[i][key] end return out end
    charts[#charts + 1] = svg.lines('KL(final || lens) after each layer: logit lens and tuned lens',
      {{'logit lens', xs, ys('lens_kl')}, {'tuned lens', xs, ys('tuned_kl')}}, {xlabel = 'layer', ylabel = 'KL (nats)', xnames = names})
    charts[#charts + 1] = svg.lines('loss read out after each layer: logit lens and tuned lens',
      {{'logit lens', xs, ys('lens_loss')}, {'tuned lens', xs, ys('tuned_lens_loss')}}, {xlabel = 'layer', ylabel = 'loss (nats)', xnames = names})
  end
  -- a bar chart of each measure the registry charts, over the rows or the blocks
  for _, m in ipairs(measures.rows) do
    local c = m.chart
    if c then
      local list, names = blocks, block_names
      if c.over == 'rows' then list, names = rows, labels end
      if c.rise then
        -- as the rise over the full model: differences of 0.1% stay visible
        local rises = {}
        for i, r in ipairs(list) do rises[i] = r[m.name] and a.loss and r[m.name] - a.loss or nil end
        charts[#charts + 1] = svg.bars(c.title, names, rises, {ylabel = ('%s - loss (%s)'):format(m.name, m.unit), offset = a.loss,
          note = ('each bar: the loss without that layer minus the full model\'s %s (a negative bar: the model is better without it)')
            :format(format.number(a.loss, 4))})
      else
        charts[#charts + 1] = svg.bars(c.title, names, column(list, m.name), {ylabel = measures.label(m.name),
          xlabel = c.over == 'rows' and 'row' or nil, reference = c.reference and {a.loss, 'full model'} or nil})
      end
      if beside[m.name] then beside[m.name]() end
    end
  end
  for _, c in ipairs(moe.charts(a)) do charts[#charts + 1] = c end  -- a model with an nn.MoE: its experts

  -- every head's attention map, the tokens on both axes: a <details> a layer
  -- (the first open), with the whole text they were read from
  local head_maps = {}
  if a.attention_maps and a.attention_tokens then
    for li, r in ipairs(blocks) do
      local m = a.attention_maps[r.name]
      if m then
        local maps = {}
        for hd = 1, m:size(1) do
          maps[#maps + 1] = svg.attention_map(('%s head %d'):format(r.name, hd), a.attention_tokens, m[hd]:tolist())
        end
        head_maps[#head_maps + 1] = ('<details%s><summary>%s: %d head%s</summary><div class="charts">%s</div></details>'):format(
          li == 1 and ' open' or '', esc(r.name), m:size(1), m:size(1) == 1 and '' or 's', table.concat(maps))
      end
    end
  end
  local prompt = table.concat(a.attention_tokens or {})

  local cols = {'name', 'verdict'}  -- the verdict beside the name: the table may be wider than the page
  for _, m in ipairs(text.columns(a)) do if m.name ~= 'verdict' then cols[#cols + 1] = m.name end end
  local thead = {}
  -- a header may break after an underscore (sae_ce_recovered over two lines): the columns stay as narrow as
  -- their numbers, and the last ones on the page
  for _, c in ipairs(cols) do thead[#thead + 1] = '<th>' .. esc(c):gsub('_', '_<wbr>') .. '</th>' end
  local tbody = {}
  for _, r in ipairs(rows) do
    local tds = {}
    for _, c in ipairs(cols) do
      local v = r[c]
      if (c == 'sae_alive' or c == 'experts_dead') and v then v = measures.by_name[c].text(r) end
      tds[#tds + 1] = '<td>' .. esc(type(v) == 'number' and format.number(v) or (v or '')) .. '</td>'
    end
    tbody[#tbody + 1] = ('<tr class="%s">%s</tr>'):format(r.verdict or '', table.concat(tds))
  end
  return table.concat({
    '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>autopsy of ', esc(a.model), '</title>',
    '<style>', page.style, '</style></head><body>',
    '<h1>Autopsy of ', esc(a.model), '</h1><p>loss ', format.number(a.loss, 4),
    a.loss_on and (' — the mean cross-entropy of the next token over ' .. esc(a.loss_on)) or '',
    a.history and a.history.val and #a.history.val > 0 and ('; the training\'s last val loss, %s at step %d, is over its own evaluation windows')
      :format(format.number(a.history.val[#a.history.val].loss, 4), a.history.val[#a.history.val].step) or '', '</p>',
    a.provenance and page.provenance(a.provenance) or '',
    '<div class="wide"><table><thead><tr>', table.concat(thead), '</tr></thead><tbody>', table.concat(tbody), '</tbody></table></div>',
    '<dl class="note">', legend_html(a), '</dl>',
    '<div class="charts">', table.concat(charts), '</div>',
    a.sections and ('<h2>Patching and attribution</h2><div class="charts">' .. table.concat(a.sections) .. '</div>') or '',
    #head_maps > 0 and ('<h2>Attention maps</h2><p class="prompt">' .. (a.patterns_text
      and ('the probe text <code>' .. esc(a.patterns_text) .. '</code>; the maps show its first ' .. #a.attention_tokens .. ' tokens: ')
      or ('the first validation window, ' .. #a.attention_tokens .. ' tokens: ')) .. '<code>' .. esc(prompt) .. '</code></p>'
      .. table.concat(head_maps)) or '',
    '</body></html>\n'})
end

return report
