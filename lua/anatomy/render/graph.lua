-- A graph of a model's components by layer (render/charts.lua's graph): the
-- embedding at the bottom, each layer's heads on one row and its MLP on the
-- next, the logits on top; edges as curves from the top of the node they
-- leave to the bottom of the one they enter, at its q, k or v for a head.
-- The numbers it draws are the table under it.
local format = require('anatomy.render.format')
local svg = require('anatomy.render.svg')
local graph = {}

local esc, num, figure, palette = svg.esc, svg.num, svg.figure, svg.palette
local BOX_W, BOX_H, ROW_H, GAP, LEFT = 64, 22, 74, 14, 120
local PORT = {q = -20, k = 0, v = 20}

-- The row of a node (0: the embedding) and the text in its box.
local function place(node, layers)
  if node.kind == 'embed' then return 0, 'embed' end
  if node.kind == 'logits' then return 2 * layers + 1, 'logits' end
  if node.kind == 'mlp' then return 2 * node.layer, 'mlp' end
  if node.kind == 'kv' then return 2 * node.layer - 1, ('kv %d'):format(node.head) end
  return 2 * node.layer - 1, ('head %d'):format(node.head)
end

-- graph.graph(title, nodes, edges, {note, layers}) -> a <figure>: nodes =
-- {{name, kind = 'embed'|'head'|'kv'|'mlp'|'logits', layer, head}, ...},
-- edges = {{from, to, via, score}, ...}; only the nodes an edge touches are
-- drawn. Blue for a positive score, red for a negative one, the stroke's
-- width by |score| against the largest.
function graph.graph(title, nodes, edges, opts)
  opts = opts or {}
  local used = {}
  for _, e in ipairs(edges) do used[e.from], used[e.to] = true, true end
  local layers = 0
  for _, n in ipairs(nodes) do if n.kind ~= 'logits' and n.kind ~= 'embed' then layers = math.max(layers, n.layer) end end
  local rows, row_names, widest = {}, {}, 1
  for _, n in ipairs(nodes) do
    if used[n.name] then
      local r, text = place(n, layers)
      rows[r] = rows[r] or {}
      table.insert(rows[r], {node = n, text = text})
      widest = math.max(widest, #rows[r])
      row_names[r] = n.kind == 'embed' and 'embedding' or n.kind == 'logits' and 'logits'
        or ('%s %s'):format(n.name:match('^(.-) '), n.kind == 'mlp' and 'mlp' or 'attention')
    end
  end
  local top_row = 2 * layers + 1
  local W = math.max(560, LEFT + widest * (BOX_W + GAP) + 40)
  local H = 30 + (top_row + 1) * ROW_H
  local at = {}
  local parts = {}
  for r = 0, top_row do
    if rows[r] then
      local y = H - 30 - r * ROW_H
      local span = #rows[r] * (BOX_W + GAP) - GAP
      local x0 = LEFT + (W - LEFT - 20 - span) / 2
      parts[#parts + 1] = ('<text x="8" y="%s" class="rowlabel">%s</text>'):format(num(y - BOX_H / 2 + 4), esc(row_names[r]))
      for i, item in ipairs(rows[r]) do
        local x = x0 + (i - 1) * (BOX_W + GAP) + BOX_W / 2
        at[item.node.name] = {x = x, y = y, head = item.node.kind == 'head' or item.node.kind == 'kv'}
      end
    end
  end
  local largest = 0
  for _, e in ipairs(edges) do largest = math.max(largest, math.abs(e.score)) end
  local drawn, table_rows = 0, {}
  for i = #edges, 1, -1 do  -- the strongest drawn last, on top
    local e = edges[i]
    local a, b = at[e.from], at[e.to]
    local x1, y1 = a.x, a.y - BOX_H
    local x2, y2 = b.x + (b.head and e.via and PORT[e.via] or 0), b.y
    local mid = (y1 + y2) / 2
    local w = largest > 0 and 0.6 + 4.4 * math.abs(e.score) / largest or 1
    parts[#parts + 1] = ('<path d="M%s %s C%s %s,%s %s,%s %s" fill="none" stroke="%s" stroke-width="%s" stroke-opacity="0.75" class="edge">'
      .. '<title>%s -> %s%s: %s</title></path>'):format(num(x1), num(y1), num(x1), num(mid), num(x2), num(mid), num(x2), num(y2),
      e.score >= 0 and palette[1] or palette[2], num(w), esc(e.from), esc(e.to), e.via and (' (' .. e.via .. ')') or '', format.number(e.score, 4))
    drawn = drawn + 1
  end
  for _, e in ipairs(edges) do table_rows[#table_rows + 1] = {e.from, e.to, e.via or '', e.score} end
  for _, n in ipairs(nodes) do
    local p = at[n.name]
    if p then
      local _, text = place(n, layers)
      parts[#parts + 1] = ('<rect x="%s" y="%s" width="%d" height="%d" rx="4" fill="#fff" stroke="#444" class="node"><title>%s</title></rect>'
        .. '<text x="%s" y="%s" text-anchor="middle" font-size="12" class="nodelabel">%s</text>'):format(num(p.x - BOX_W / 2), num(p.y - BOX_H), BOX_W, BOX_H,
        esc(n.name), num(p.x), num(p.y - BOX_H / 2 + 4), esc(text))
      if p.head then
        for _, via in ipairs({'q', 'k', 'v'}) do  -- in this order: the file is the same from run to run
          local dx = PORT[via]
          parts[#parts + 1] = ('<text x="%s" y="%s" text-anchor="middle" font-size="9" fill="#555" class="port">%s</text>'):format(num(p.x + dx), num(p.y + 10), via)
        end
      end
    end
  end
  parts[#parts + 1] = ('<g class="legend"><rect x="%d" y="8" width="10" height="10" fill="%s"/><text x="%d" y="17">positive</text>'
    .. '<rect x="%d" y="8" width="10" height="10" fill="%s"/><text x="%d" y="17">negative</text></g>'):format(
    W - 150, palette[1], W - 136, W - 80, palette[2], W - 66)
  return figure{title = title, kind = 'graph', points = drawn, w = W, h = H, body = table.concat(parts), note = opts.note,
    head = {'from', 'to', 'via', 'score'}, table = table_rows, scroll = W > 900}
end

return graph
