-- The HTML page every result shares: one style, a self-contained page
-- (nothing fetched; no scripts but an attribution graph's few lines,
-- render/attribution.lua), the provenance block at its top, and the page
-- scoped into a <div> for a notebook. The autopsy's report, comparisons,
-- patching grids, figures and graph reports all render through it.
local esc = require('anatomy.render.charts').esc
local provenance = require('anatomy.render.provenance')  -- a record as text
local page = {}

-- The run's provenance at the top: one labelled line each (provenance.fields),
-- then extra's {label, text} lines (what the result itself was made from).
local function provenance_html(rec, extra)
  local out = {'<dl class="provenance">'}
  for _, list in ipairs({provenance.fields(rec), extra or {}}) do
    for _, f in ipairs(list) do out[#out + 1] = ('<dt>%s</dt><dd>%s</dd>'):format(esc(f[1]), esc(f[2])) end
  end
  out[#out + 1] = '</dl>'
  return table.concat(out)
end
page.provenance = provenance_html

local style = [[
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; max-width: 1200px; }
h1 { font-size: 20px; } table { border-collapse: collapse; font: 12px monospace; }
td, th { padding: 2px 6px; border-bottom: 1px solid #ddd; text-align: right; } td:first-child, th:first-child { text-align: left; }
.passenger { color: #888; } .boundary { color: #d62728; font-weight: bold; } .exploding { color: #ff7f0e; font-weight: bold; }
.charts { display: flex; flex-wrap: wrap; gap: 16px; } figure { margin: 0; border: 1px solid #eee; padding: 8px; }
figcaption { font-weight: bold; margin-bottom: 4px; } .axis { stroke: #999; } .grid { stroke: #eee; } .group { stroke: #bbb; }
.reference { stroke: #d62728; stroke-dasharray: 4 3; } .xtick, .ytick, .rowlabel, .value { font-size: 10px; fill: #555; }
.xlabel, .ylabel { font-size: 11px; fill: #333; } .legend { font-size: 11px; } .scroll { max-height: 620px; overflow: auto; }
td.differs { background: #fde2c4; font-weight: bold; } table.compare { margin: 0 16px 16px 0; align-self: flex-start; }
details.numbers { font-size: 11px; } details.numbers table { font-size: 11px; } .prompt code { white-space: pre-wrap; }
.label { text-anchor: middle; } .note { font-size: 11px; color: #666; max-width: 560px; }
.warning { color: #b45309; font-weight: bold; }
.wide { overflow-x: auto; max-width: 100%; }
.wide th:first-child, .wide td:first-child { position: sticky; left: 0; background: #fff; z-index: 1; }
.wide th { white-space: normal; vertical-align: bottom; min-width: 5ch; } .wide td, .wide th { padding: 2px 5px; }
dl.note { display: grid; grid-template-columns: max-content 1fr; gap: 0 12px; max-width: 900px; }
dl.note dt { font-family: monospace; } dl.note dd { margin: 0; }
.provenance { font-size: 12px; color: #444; background: #f6f6f6; padding: 6px 8px; display: grid;
  grid-template-columns: max-content 1fr; gap: 0 12px; } .provenance dt { font-weight: bold; } .provenance dd { margin: 0; }
]]
page.style = style  -- also inside standalone charts (render/figure.lua)

-- page.scope_style(css, scope) -> css with every rule limited to what lies
-- inside `scope` (a selector; `body` becomes the scope itself), so that a
-- report shown inside a page that is not its own (a notebook) restyles
-- nothing else there.
function page.scope_style(css, scope)
  return (css:gsub('([^{}]+)(%b{})', function(selectors, rule)
    local out = {}
    for sel in selectors:gmatch('[^,]+') do
      sel = sel:match('^%s*(.-)%s*$')
      out[#out + 1] = (sel == 'body' or sel == 'html') and scope or (scope .. ' ' .. sel)
    end
    return '\n' .. table.concat(out, ', ') .. ' ' .. rule
  end))
end

-- page.embed(html) -> a page made by page.new (a report, a comparison, a
-- patching grid) as one <div class="anatomy-output">: its body, under its
-- style scoped to that div. What a notebook shows.
function page.embed(html)
  local css = html:match('<style>(.-)</style>') or ''
  local body = html:match('<body[^>]*>(.*)</body>') or html
  return ('<div class="anatomy-output"><style>%s</style>%s</div>'):format(page.scope_style(css, '.anatomy-output'), body)
end

-- page.new(title, body) -> a self-contained HTML page in the shared style
function page.new(title, body)
  return table.concat({'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>', esc(title), '</title>',
    '<style>', style, '</style></head><body><h1>', esc(title), '</h1>', body, '</body></html>\n'})
end

return page
