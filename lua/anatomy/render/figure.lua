-- Figure: one chart as a value. It prints as its terminal form; in a
-- notebook it shows as SVG (its _repr_mimebundle); fig:svg() is the SVG,
-- standalone (the report's styles inside it), and fig:save(path) writes it.
local page = require('anatomy.render.page')
local charts = require('anatomy.render.charts')
local terminal = require('anatomy.render.terminal')
local result = require('anatomy.render.result')
local Figure = {}
Figure.__index = Figure

-- Figure.new(title, figure_html, text): figure_html is a chart of
-- anatomy/render/charts.lua (<figure> with its <svg>), text its terminal form.
function Figure.new(title, figure_html, text)
  return setmetatable({title = title, html_figure = figure_html, text = text}, Figure)
end

-- Figure.attention(title, tokens, m, numbers) -> one head's attention map
-- m (Tq, Tk) with its tokens on both axes: shaded text (numbers = true: the
-- weights) when printed, a heatmap in a notebook.
function Figure.attention(title, tokens, m, numbers)
  return Figure.new(title, charts.attention_map(title, tokens, m:tolist()),
    terminal.attention_map(m, tokens, title, numbers))
end

function Figure:__tostring() return self.text end

function Figure:svg()
  local svg = self.html_figure:match('<svg.-</svg>')
  -- the figure's caption as the SVG's title; the page's styles (not its
  -- body's) inside it, limited to this SVG: an SVG inlined into a page would
  -- otherwise restyle the page
  local style = page.scope_style(page.style:gsub('body {[^}]*}', ''), 'svg.anatomy-chart')
  local open = svg:match('^<svg[^>]*>')
  local tag, marked = open:gsub(' class="([^"]*)"', ' class="%1 anatomy-chart"', 1)
  if marked == 0 then tag = tag:gsub('^<svg', '<svg class="anatomy-chart"') end
  if not tag:match(' xmlns=') then tag = tag:gsub('^<svg', '<svg xmlns="http://www.w3.org/2000/svg"') end
  tag = tag .. ('<title>%s</title><style>%s</style>'):format(charts.esc(self.title), style)
  return tag .. svg:sub(#open + 1)
end

-- fig:save(path) -> path: the standalone SVG, written as every result writes (render/result.lua)
function Figure:save(path)
  local written = result.write(path, self:svg(), 'fig:save')
  return written
end

-- The chart as HTML (its caption, the SVG, its numbers) under the report's
-- style, limited to it (a notebook's page is not ours to restyle).
function Figure:html()
  return ('<div class="anatomy-output"><style>%s</style>%s</div>'):format(
    page.scope_style(page.style, '.anatomy-output'), self.html_figure)
end

-- In a notebook: HTML (which nbconvert keeps whole; its SVG sanitizer strips
-- an SVG's drawing) and SVG for frontends that prefer it.
function Figure:_repr_mimebundle()
  return {['text/html'] = self:html(), ['image/svg+xml'] = self:svg(), ['text/plain'] = self.text}
end

return Figure
