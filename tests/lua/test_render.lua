-- Rendering (lua/anatomy/render/): chart axes, ticks and colour bars.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, close, raises = H.test, H.eq, H.close, H.raises
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')


test('colour bars and axes get at least three readable ticks; zero and missing cells are drawn apart from small values', function()
  local charts = require 'anatomy.render.charts'
  for _, range in ipairs{{0.246, 0.254}, {0.2487, 0.2491}, {1, 1.001}, {0, 1}, {-3, 1e4}, {2.371, 2.378}} do
    local ticks = charts.nice_ticks(range[1], range[2], 4)
    assert(#ticks >= 3, ('%g..%g: %d ticks'):format(range[1], range[2], #ticks))
    for _, t in ipairs(ticks) do assert(t >= range[1] - 1e-12 and t <= range[2] + 1e-12, 'tick ' .. t .. ' inside the range') end
  end
  local fig = charts.heatmap('entropy', {'blocks.1', 'blocks.2'}, {'head 1', 'head 2'}, {{0.246, 0.254}, {0.25, 0.2501}}, false, {})
  local labels = {}
  for t in fig:gmatch('class="ytick" dy="3">([^<]+)<') do labels[#labels + 1] = t end
  assert(#labels >= 3, 'the colour bar has ' .. #labels .. ' tick labels: ' .. table.concat(labels, ', '))
  local seen = {}
  for _, l in ipairs(labels) do assert(not seen[l], 'two ticks read ' .. l); seen[l] = true end
  local log = charts.heatmap('grad', {'a', 'b'}, {'1', '2'}, {{1e-3, 0}, {nil, 2e-3}}, true, {})
  assert(log:find('class="zero"', 1, true) and log:find('<title>a, 2: 0</title>', 1, true), 'a zero cell on a log scale is marked')
  assert(log:find('class="missing"', 1, true) and log:find('b, 1: no value', 1, true), 'a missing cell is marked')
  assert(log:find('>no value</text>', 1, true) and log:find('class="cellkey"', 1, true), 'the key under the colour bar says so')
  -- values of both signs: the scale is symmetric about 0, so 0 takes the pale middle colour
  local signed = charts.heatmap('share', {'a'}, {'1', '2', '3'}, {{-0.2, 0, 0.6}}, false, {})
  local zero_fill = signed:match('fill="(rgb%([%d,]+%))"><title>a, 2: 0%.0000')
  H.eq(zero_fill, 'rgb(247,247,247)', 'the colour of 0 between -0.2 and 0.6')
  local labels2 = {}
  for t in signed:gmatch('class="ytick" dy="3">([^<]+)<') do labels2[#labels2 + 1] = tonumber(t) end
  table.sort(labels2)
  assert(labels2[1] <= -0.4 and labels2[#labels2] >= 0.4, 'the colour bar spans -0.6 to 0.6, its ticks: ' .. table.concat(labels2, ', '))
  local plain = charts.heatmap('grad', {'a'}, {'1', '2'}, {{1e-3, 2e-3}}, true, {})
  assert(not plain:find('cellkey', 1, true), 'no key when every cell has a colour')
end)

test("a bar's length is its value: the axis of a bar chart starts at 0, close values or not", function()
  local charts = require 'anatomy.render.charts'
  local svg = tostring(charts.bars('loss', {'a', 'b'}, {0.81, 1.33}))
  local heights = {}
  for h in svg:gmatch('<rect[^>]- height="([%d%.]+)"[^>]-data%-value') do heights[#heights + 1] = tonumber(h) end
  eq(#heights, 2)
  close(heights[1] / heights[2], 0.81 / 1.33, 0.01, 'bar heights in proportion to the values')
  local close_values = tostring(charts.bars('loss', {'a', 'b'}, {2.371, 2.378}))
  local hs = {}
  for h in close_values:gmatch('<rect[^>]- height="([%d%.]+)"[^>]-data%-value') do hs[#hs + 1] = tonumber(h) end
  close(hs[1] / hs[2], 2.371 / 2.378, 0.01, 'close values too')
end)


test('one result protocol: every result writes its JSON and its page, and shows in a notebook, the same way', function()
  local result = require('anatomy.render.result')
  local s = experiment.sweep({{'n', {1, 2}}}, function(cfg) return {y = cfg.n * 2} end, {quiet = true})
  local types = {autopsy.Autopsy, require('anatomy.autopsy.compare').Comparison, require('anatomy.autopsy.series').Series, getmetatable(s)}
  for i, T in ipairs(types) do
    local Made = result.outputs(setmetatable({}, {__index = T}), 'x')  -- what the protocol makes from T's description
    for _, method in ipairs{'json', 'report', '_repr_mimebundle'} do
      eq(debug.getinfo(T[method], 'S').source, debug.getinfo(Made[method], 'S').source, ('type %d: %s from render/result.lua'):format(i, method))
    end
  end
  local dir = H.tmpdir()
  local path = s:json(dir .. '/made/for/it/s.json')
  eq(H.read(path), json.encode(s:data()) .. '\n', 'the data as JSON, its folder made')
  eq(H.read(s:report(dir .. '/s.html', 'A sweep')), s:html('A sweep'), 'the page, its arguments passed on')
  local bundle = s:_repr_mimebundle()
  eq(bundle['text/html'], s:html(), 'a notebook: the page (the kernel scopes it)')
  eq(bundle['text/plain'], tostring(s))
  raises(function() s:json(3) end, 'sweep:json: path must be a file path, got number')
  raises(function() s:report('') end, 'sweep:report: path must be a file path, got string')
  raises(function() result.write(nil, 'x', 'fig:save') end, 'fig:save: path must be a file path, got nil')
  os.execute("rm -rf '" .. dir .. "'")
end)

H.done()
