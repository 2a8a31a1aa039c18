-- Figure: one chart as a value. It prints as its terminal form; in a
-- notebook it shows as SVG (its _repr_mimebundle); fig:svg() is the SVG,
-- standalone (the report's styles inside it), and fig:save(path) writes it.
local Figure = {}
Figure.__index = Figure

-- Figure.new(title, figure_html, text): figure_html is a chart of
-- anatomy/charts.lua (<figure> with its <svg>), text its terminal form.
function Figure.new(title, figure_html, text)
  return setmetatable({title = title, html_figure = figure_html, text = text}, Figure)
end

function Figure:__tostring() return self.text end

function Figure:svg()
  local svg = self.html_figure:match('<svg.-</svg>')
  local style = require('anatomy.autopsy.report').style
  -- the figure's caption as the SVG's title; the page's styles inside it
  return (svg:gsub('^<svg ', '<svg xmlns="http://www.w3.org/2000/svg" ', 1)
    :gsub('>', ('><title>%s</title><style>%s</style>'):format(require('anatomy.charts').esc(self.title),
      style:gsub('%%', '%%%%')), 1))
end

function Figure:save(path)
  return require('anatomy.fs').write_atomic(path, self:svg())
end

-- The chart as HTML (its caption, the SVG, its numbers), with the report's
-- chart styles and not its page's (a notebook's page is not ours to restyle).
function Figure:html()
  local style = require('anatomy.autopsy.report').style:gsub('body {[^}]*}', ''):gsub('h1 {[^}]*}', '')
  return ('<div class="anatomy-figure"><style>%s</style>%s</div>'):format(style, self.html_figure)
end

-- In a notebook: HTML (which nbconvert keeps whole; its SVG sanitizer strips
-- an SVG's drawing) and SVG for frontends that prefer it.
function Figure:_repr_mimebundle()
  return {['text/html'] = self:html(), ['image/svg+xml'] = self:svg(), ['text/plain'] = self.text}
end

return Figure
