-- An attribution graph drawn as circuit-tracer's and Neuronpedia's graph
-- viewers draw one (features/graph_report.lua makes the data from a
-- sae.Graph): x the prompt's positions, y the layers (the token embeddings
-- at the bottom, the logits on top), edges from source to target coloured
-- by sign and as wide as |weight|; and beside it the table of the same
-- nodes. Plain data in, HTML out: a node is {id, kind = 'feature' | 'error'
-- | 'token' | 'logit', layer, pos, feature, activation, probability,
-- token, token_id, influence, cumulative, url, drawn}; an edge {source,
-- target, weight} (ids).
local svg = require('anatomy.render.svg')
local format = require('anatomy.render.format')
local attribution = {}

local esc, num, palette = svg.esc, svg.num, svg.palette
local SP, SP_LOGIT, MIN_COL, LEFT, RIGHT = 17, 28, 20, 52, 44  -- node spacing (a logit's), narrowest column, margins
local WIDTH = 760                                 -- the chart's width, at least
local LABEL_MAX = 14                              -- characters of a token drawn (the whole in its title)
local colors = {feature = {'#fbd38d', '#b7791f'}, error = {'#d1d5db', '#6b7280'}, token = {'#9ae6b4', '#2f855a'},
  logit = {'#d6bcfa', '#6b46c1'}}

-- A token's text on one line: a newline as ↵, a tab as ⇥; spaces stay (the
-- labels keep them) but where they are all there is (a space token), as ␣
function attribution.visible(s)
  s = tostring(s):gsub('\n', '↵'):gsub('\t', '⇥')
  if not s:find('[^ ]') then s = s:gsub(' ', '␣') end
  return s
end

local function short(s)
  local chars = {}
  for ch in s:gmatch('[%z\1-\127\194-\244][\128-\191]*') do chars[#chars + 1] = ch end
  if #chars <= LABEL_MAX then return s end
  return table.concat(chars, '', 1, LABEL_MAX - 1) .. '…'
end

local function width_of(s)  -- in characters (UTF-8 sequences)
  local n = 0
  for _ in s:gmatch('[%z\1-\127\194-\244][\128-\191]*') do n = n + 1 end
  return n
end

-- The shape of a node at (x, y): a circle (feature), a square (error), a
-- rounded rectangle (token), a diamond (logit)
local function shape(kind, x, y)
  local fill, stroke = colors[kind][1], colors[kind][2]
  if kind == 'feature' then
    return ('<circle cx="%s" cy="%s" r="5.5" fill="%s" stroke="%s"/>'):format(num(x), num(y), fill, stroke)
  elseif kind == 'error' then
    return ('<rect x="%s" y="%s" width="10" height="10" fill="%s" stroke="%s"/>'):format(num(x - 5), num(y - 5), fill, stroke)
  elseif kind == 'token' then
    return ('<rect x="%s" y="%s" width="16" height="11" rx="3" fill="%s" stroke="%s"/>'):format(num(x - 8), num(y - 5.5), fill, stroke)
  end
  return ('<path d="M%s %sl7 7l-7 7l-7 -7z" fill="%s" stroke="%s"/>'):format(num(x), num(y - 7), fill, stroke)
end

-- a node's name in titles and the table: 'L2 F17 @5', 'error L2 @5', 'token @5', 'logit " cat"'
function attribution.name(n)
  if n.kind == 'feature' then return ('L%d F%d @%d'):format(n.layer, n.feature, n.pos) end
  if n.kind == 'error' then return ('error L%d @%d'):format(n.layer, n.pos) end
  if n.kind == 'token' then return ('token @%d'):format(n.pos) end
  return ('logit "%s"'):format(attribution.visible(n.token))
end

local function title(n)
  local lines = {attribution.name(n)}
  if n.kind == 'feature' then
    lines[#lines + 1] = ('layer %d, position %d (%q), feature %d (1-based)'):format(n.layer, n.pos, attribution.visible(n.at_token), n.feature)
    lines[#lines + 1] = 'activation ' .. format.number(n.activation, 4)
  elseif n.kind == 'error' then
    lines[#lines + 1] = ('the MLP reconstruction error of layer %d at position %d (%q)'):format(n.layer, n.pos, attribution.visible(n.at_token))
  elseif n.kind == 'token' then
    lines[#lines + 1] = ('the embedding of %q (token id %d) at position %d'):format(attribution.visible(n.token), n.token_id, n.pos)
  else
    lines[#lines + 1] = ('token id %d, probability %s'):format(n.token_id, format.number(n.probability, 4))
  end
  if n.kind ~= 'logit' then
    lines[#lines + 1] = ('influence %s (cumulative %s)'):format(format.number(n.influence, 4), format.number(n.cumulative, 4))
  end
  return table.concat(lines, '\n')
end

-- attribution.chart(spec) -> the graph as an <svg class="attribution"> (data-nodes, data-edges: how many it draws),
-- and the number of edges drawn: spec = {nodes, edges, n_layers, n_pos, tokens (each position's text)}; only the
-- nodes with drawn set, and the edges between two of them
function attribution.chart(spec)
  local L, T = spec.n_layers, spec.n_pos
  local cells, widest = {}, {}   -- cells[row][pos] = the nodes drawn there; widest[pos] = most in one row
  for p = 1, T do widest[p] = 1 end
  local drawn, n_drawn = {}, 0
  for _, n in ipairs(spec.nodes) do
    if n.drawn then
      n_drawn = n_drawn + 1
      local row = n.kind == 'token' and 0 or n.kind == 'logit' and L + 1 or n.layer
      cells[row] = cells[row] or {}
      cells[row][n.pos] = cells[row][n.pos] or {}
      table.insert(cells[row][n.pos], n)
      widest[n.pos] = math.max(widest[n.pos], #cells[row][n.pos])
      drawn[n.id] = n
    end
  end
  local labels, longest = {}, 1
  for p = 1, T do
    labels[p] = short(attribution.visible(spec.tokens[p]))
    longest = math.max(longest, width_of(labels[p]))
  end
  local col, x0, total = {}, {}, 0
  for p = 1, T do
    local logits = cells[L + 1] and cells[L + 1][p]
    col[p] = math.max(MIN_COL, widest[p] * SP + 8, logits and #logits * SP_LOGIT + 8 or 0)
    total = total + col[p]
  end
  local stretch = math.max(1, (WIDTH - LEFT - RIGHT) / total)  -- a short prompt fills the chart's width
  local fits = true
  for p = 1, T do
    col[p] = col[p] * stretch
    if width_of(labels[p]) * 6.6 + 6 > col[p] then fits = false end
  end
  local RH = math.max(30, math.min(64, math.floor(620 / (L + 2))))
  local TOP = 84                                   -- the logits' labels, slanted
  local BOTTOM = fits and 36 or math.floor(longest * 5.2 + 34)
  local x = LEFT  -- the columns' left edges (fractional where a short prompt is stretched)
  for p = 1, T do x0[p] = x; x = x + col[p] end
  local W, H = math.ceil(x + RIGHT), TOP + (L + 2) * RH + BOTTOM  -- W grows below to hold the logits' labels
  local function row_y(r) return TOP + (L + 1 - r) * RH + RH / 2 end
  local parts = {}
  for r = 0, L + 1 do  -- bands, one a row, and their labels
    local y = TOP + (L + 1 - r) * RH
    parts[#parts + 1] = ('<rect x="%d" y="%d" width="%s" height="%d" fill="%s"/>'):format(LEFT, y, num(x - LEFT), RH,
      (r == 0 or r == L + 1) and '#efece3' or (r % 2 == 1 and '#f7f6f2' or '#fdfcf9'))
    local name = r == 0 and 'Emb' or r == L + 1 and 'Logit' or ('L' .. r)
    -- on both sides: a wide chart starts scrolled to its right end
    parts[#parts + 1] = ('<text x="%d" y="%s" class="rowlabel" text-anchor="end" dy="3">%s</text><text x="%s" y="%s" class="rowlabel" dy="3">%s</text>')
      :format(LEFT - 6, num(y + RH / 2), name, num(x + 6), num(y + RH / 2), name)
  end
  for p = 2, T do
    parts[#parts + 1] = ('<line x1="%s" y1="%d" x2="%s" y2="%d" stroke="#fff" stroke-width="1.5"/>'):format(num(x0[p]), TOP, num(x0[p]),
      TOP + (L + 2) * RH)
  end
  local at = {}
  for r = 0, L + 1 do
    for p, list in pairs(cells[r] or {}) do
      table.sort(list, function(a, b)  -- features before errors, each the most influential first; logits by probability
        if a.kind ~= b.kind then return a.kind == 'feature' end
        if a.kind == 'logit' then return a.probability > b.probability end
        return a.cumulative < b.cumulative
      end)
      local sp = r == L + 1 and SP_LOGIT or SP
      local span = (#list - 1) * sp
      for i, n in ipairs(list) do at[n.id] = {x = x0[p] + col[p] / 2 - span / 2 + (i - 1) * sp, y = row_y(r)} end
    end
  end
  local edges, largest = {}, 0
  for _, e in ipairs(spec.edges) do
    if drawn[e.source] and drawn[e.target] then
      edges[#edges + 1] = e
      largest = math.max(largest, math.abs(e.weight))
    end
  end
  table.sort(edges, function(a, b) return math.abs(a.weight) < math.abs(b.weight) end)  -- the strongest on top
  for _, e in ipairs(edges) do
    local a, b = at[e.source], at[e.target]
    local mid = (a.y + b.y) / 2
    local share = largest > 0 and math.abs(e.weight) / largest or 1
    -- as wide as |weight| against the widest; the weak ones fainter too, so that a dense graph shows its strong edges
    parts[#parts + 1] = ('<path class="edge" data-source="%d" data-target="%d" d="M%s %sC%s %s,%s %s,%s %s" stroke="%s" stroke-width="%s" '
      .. 'stroke-opacity="%.2f">'
      .. '<title>%s → %s: %s</title></path>'):format(e.source, e.target, num(a.x), num(a.y), num(a.x), num(mid), num(b.x), num(mid),
      num(b.x), num(b.y), e.weight >= 0 and palette[1] or palette[2], num(0.5 + 4.5 * share), 0.12 + 0.78 * math.sqrt(share),
      esc(attribution.name(drawn[e.source])),
      esc(attribution.name(drawn[e.target])), format.number(e.weight, 4))
  end
  for _, n in ipairs(spec.nodes) do
    local p = at[n.id]
    if p then
      local g = ('<g class="node %s" data-node="%d"><title>%s</title>%s</g>'):format(n.kind, n.id, esc(title(n)), shape(n.kind, p.x, p.y))
      if n.url then g = ('<a href="%s">%s</a>'):format(esc(n.url), g) end
      parts[#parts + 1] = g
      if n.kind == 'logit' then
        local label = short(attribution.visible(n.token)) .. ' ' .. format.number(n.probability, 3)
        parts[#parts + 1] = ('<text class="logitlabel" transform="translate(%s,%s) rotate(-40)">%s</text>'):format(num(p.x + 2),
          num(p.y - 11), esc(label))
        W = math.max(W, math.ceil(p.x + 10 + width_of(label) * 6.6 * 0.77))
      end
    end
  end
  for p = 1, T do  -- each position's number, and the prompt along the bottom
    local cx, y = x0[p] + col[p] / 2, TOP + (L + 2) * RH
    if col[p] >= 6 * #tostring(p) + 4 then
      parts[#parts + 1] = ('<text class="pos" x="%s" y="%d" text-anchor="middle">%d</text>'):format(num(cx), y + 11, p)
    end
    if fits then
      parts[#parts + 1] = ('<text class="xtick" x="%s" y="%d" text-anchor="middle">%s</text>'):format(num(cx), y + 26, esc(labels[p]))
    else
      parts[#parts + 1] = ('<text class="xtick" text-anchor="end" transform="translate(%s,%d) rotate(-50)">%s</text>'):format(num(cx + 3),
        y + 22, esc(labels[p]))
    end
  end
  return ('<svg class="attribution" data-nodes="%d" data-edges="%d" viewBox="0 0 %d %d" width="%d" height="%d">%s</svg>'):format(
    n_drawn, #edges, W, H, W, H, table.concat(parts)), #edges
end

-- attribution.legend() -> the node shapes and edge colours, as a small <svg>
function attribution.legend()
  local items = {{'feature', 'feature'}, {'error', 'error (MLP reconstruction)'}, {'token', 'token embedding'}, {'logit', 'logit'}}
  local parts, x = {}, 8
  for _, it in ipairs(items) do
    parts[#parts + 1] = shape(it[1], x + 6, 13)
    parts[#parts + 1] = ('<text x="%d" y="17">%s</text>'):format(x + 18, esc(it[2]))
    x = math.floor(x + 26 + #it[2] * 6.4)
  end
  for _, it in ipairs({{palette[1], 'positive edge'}, {palette[2], 'negative edge'}}) do
    parts[#parts + 1] = ('<line x1="%d" y1="13" x2="%d" y2="13" stroke="%s" stroke-width="3"/><text x="%d" y="17">%s</text>'):format(
      x, x + 22, it[1], x + 28, it[2])
    x = math.floor(x + 34 + #it[2] * 6.4)
  end
  return ('<svg class="legend" width="%d" height="26">%s</svg>'):format(math.ceil(x), table.concat(parts))
end

-- attribution.table(spec) -> the nodes as a table, in spec.nodes' order, one <tr data-node> a node
function attribution.table(spec)
  local out = {'<table class="nodes"><thead><tr><th>#</th><th>node</th><th>layer</th><th>pos</th><th>token</th><th>feature</th>',
    '<th>activation</th><th>p</th><th>influence</th><th>cumulative</th></tr></thead><tbody>'}
  for i, n in ipairs(spec.nodes) do
    local feature = n.feature and tostring(n.feature) or ''
    if n.url then feature = ('<a href="%s">%s</a>'):format(esc(n.url), feature) end
    local token = (n.kind == 'token' or n.kind == 'logit') and n.token or n.at_token
    out[#out + 1] = ('<tr data-node="%d"%s><td>%d</td><td>%s</td><td>%s</td><td>%d</td><td class="tok">%s</td><td>%s</td><td>%s</td>'
      .. '<td>%s</td><td>%s</td><td>%s</td></tr>'):format(n.id, n.drawn and '' or ' class="undrawn"', i, n.kind,
      n.kind == 'token' and 'Emb' or n.kind == 'logit' and 'Logit' or tostring(n.layer), n.pos,
      esc(attribution.visible(token)), feature,
      n.activation and format.number(n.activation, 4) or '', n.probability and format.number(n.probability, 4) or '',
      n.kind == 'logit' and '' or format.number(n.influence, 4), n.kind == 'logit' and '' or format.number(n.cumulative, 4))
  end
  out[#out + 1] = '</tbody></table>'
  return table.concat(out)
end

attribution.style = [[
body { max-width: none; } .graphpage { display: flex; flex-wrap: wrap; gap: 16px; align-items: flex-start; }
.graphchart { flex: 1 1 600px; min-width: 0; overflow: auto; max-height: 900px; border: 1px solid #eee; }
.graphtable { flex: 0 0 auto; max-height: 900px; overflow: auto; } .graphtable .note { margin-top: 0; }
svg.attribution .rowlabel, svg.attribution .xtick { font-size: 11px; fill: #333; white-space: pre; }
svg.attribution .pos { font-size: 9px; fill: #999; } svg.attribution .logitlabel { font-size: 11px; fill: #333; white-space: pre; }
svg.attribution .edge { fill: none; } svg.attribution .node { cursor: pointer; }
svg.attribution.focus .edge { stroke-opacity: 0.04; } svg.attribution.focus .edge.hi { stroke-opacity: 0.95; }
svg.attribution.focus .node { opacity: 0.25; } svg.attribution.focus .node.hi { opacity: 1; }
svg.attribution .node.on circle, svg.attribution .node.on rect, svg.attribution .node.on path { stroke: #000; stroke-width: 2.5; }
svg.legend { font-size: 11px; } table.nodes td.tok { white-space: pre; text-align: left; } table.nodes tr.undrawn { color: #999; }
table.nodes tr.hi { background: #fff3bf; } table.nodes tbody tr { cursor: pointer; }
.summary { font-size: 13px; max-width: 1100px; } .summary b { font-weight: 600; }
]]

-- Clicking a node (or its table row) lights its edges and the nodes at their
-- other ends; again, or on the background, clears. A feature node with a
-- link follows it on the second click. A chart wider than its box starts
-- scrolled to its right end, where the logits are.
attribution.script = [[
(function () {
  var svg = document.querySelector('svg.attribution'); if (!svg) return;
  svg.parentNode.scrollLeft = svg.parentNode.scrollWidth;  // a chart wider than its box shows its last positions, the logits
  var focused = null;
  function all(sel) { return Array.prototype.slice.call(document.querySelectorAll(sel)); }
  function clear() {
    focused = null; svg.classList.remove('focus');
    all('svg.attribution .hi, svg.attribution .on, table.nodes tr.hi').forEach(function (e) { e.classList.remove('hi'); e.classList.remove('on'); });
  }
  function focus(id) {
    clear(); focused = id; svg.classList.add('focus');
    var near = {}; near[id] = true;
    all('svg.attribution .edge').forEach(function (e) {
      var s = e.getAttribute('data-source'), t = e.getAttribute('data-target');
      if (s === id || t === id) { e.classList.add('hi'); near[s] = true; near[t] = true; }
    });
    all('svg.attribution .node').forEach(function (n) {
      var i = n.getAttribute('data-node'); if (near[i]) n.classList.add('hi'); if (i === id) n.classList.add('on');
    });
    all('table.nodes tr[data-node="' + id + '"]').forEach(function (r) { r.classList.add('hi'); });
  }
  svg.addEventListener('click', function (ev) {
    var n = ev.target.closest('.node');
    if (!n) { clear(); return; }
    var id = n.getAttribute('data-node');
    if (id === focused) { if (!ev.target.closest('a')) clear(); return; }
    ev.preventDefault(); focus(id);
  });
  all('table.nodes tbody tr').forEach(function (r) {
    r.addEventListener('click', function (ev) {
      if (ev.target.closest('a')) return;
      var id = r.getAttribute('data-node'); if (id === focused) clear(); else focus(id);
    });
  });
})();
]]

return attribution
