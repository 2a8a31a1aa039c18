-- edges: edge attribution patching. Where patching.attribute scores a
-- component, patching.edges scores the connections between them: how much
-- the metric would move if the clean output of one upstream component (the
-- embedding, one head, one MLP) reached one downstream input (a head's
-- query, key or value, an MLP's input, the logits) and nothing else did.
-- Each edge is (clean - corrupt output of u) . d metric / d (v's input),
-- from the residual stream's being a sum: v reads the embedding plus every
-- earlier output, so an edge is one term of that sum (EAP, Syed et al.,
-- 2023). With method = 'eap-ig' the gradients are averaged over runs whose
-- embedding moves from the corrupt to the clean one (Hanna et al., 2024).
--   local g = patching.edges(model, clean, corrupt, metric)
--   print(g:prune{top = 20}); g:prune{top = 20}:report('out/edges.html')
local torch = require('anatomy.torch')
local points = require('anatomy.probe.points')
local Cache = require('anatomy.probe.cache')
local hooks = require('anatomy.probe.hooks')
local scope = require('anatomy.probe.scope')
local runs = require('anatomy.probe.runs')
local inputs = require('anatomy.probe.inputs')
local options = require('anatomy.torch.options')
local format = require('anatomy.render.format')
local charts = require('anatomy.render.charts')
local page = require('anatomy.render.page')
local result = require('anatomy.render.result')
local terminal = require('anatomy.render.terminal')

local edges = {}

local Graph = {}
Graph.__index = Graph
edges.Graph = Graph

local ROLES = {'q', 'k', 'v'}

-- The parts of each layer edge attribution reads: its attention (q, k, v,
-- result), its MLP (the module's output; none for an attention-only layer)
-- and its residual stream (resid_pre, and resid_mid where the block has it).
local function layer_parts(model, where)
  local layers, why = model:layers()
  if not layers then error(('%s: %s'):format(where, why), 3) end
  local out = {}
  for i, l in ipairs(layers) do
    local ok, z = pcall(runs.point, model, l[1], 'attn.z')
    if not ok then error(('%s: %s'):format(where, z), 3) end
    local attn = z:gsub('%.z$', '')
    for _, p in ipairs{'q', 'k', 'v', 'result'} do
      if not pcall(points.locate, model, attn .. '.' .. p, 1) then
        error(("%s: %s publishes no '%s' hook point; edge attribution reads q, k, v and result"):format(where, attn, p), 3)
      end
    end
    local has_mlp, post = pcall(runs.point, model, l[1], 'mlp.post')
    local part = {name = l[1], attn = attn, mlp = has_mlp and post:gsub('%.post$', '') or nil, pre = l[1] .. '.resid_pre'}
    if not pcall(points.locate, model, part.pre, 1) then
      error(("%s: %s publishes no resid_pre; edge attribution reads the residual stream"):format(where, l[1]), 3)
    end
    if pcall(points.locate, model, l[1] .. '.resid_mid', 1) then part.mid = l[1] .. '.resid_mid' end
    out[i] = part
  end
  local last = out[#out].name .. '.resid_post'
  if not pcall(points.locate, model, last, 1) then
    error(("%s: %s publishes no resid_post; edge attribution reads the residual stream"):format(where, out[#out].name), 3)
  end
  return out, last
end

-- One forward of ids with the tensors at `names` kept with their gradients
-- (retain_grad); embed, when given, replaces the first layer's resid_pre.
-- Returns the metric (a scalar tensor) and {name = tensor}.
local function forward_kept(model, ids, mask, metric, names, first_pre, embed, where)
  local kept = {}
  local out = scope.run(model, function()
    if embed then hooks.replace(model, first_pre, function() return embed end) end
    for _, name in ipairs(names) do
      hooks.replace(model, name, function(t)
        if t.requires_grad then t:retain_grad() end
        kept[name] = t
        return t
      end)
    end
    return runs.as_scalar(metric(inputs.forward(model, ids, mask, where), mask), where)
  end)
  return out, kept
end

-- The gradient of the metric at each downstream input along that input
-- alone. One forward of S copies of the batch (S: the most slots a layer
-- has, a head's q, k or v, or the MLP's input), every layer's resid_pre and
-- resid_mid replaced by fresh leaves with the same values, so no gradient
-- crosses a layer; then one backward of sum(q * g_q) + ... over the slots,
-- g the metric's gradient at that point, each slot's copy of the batch
-- carrying one head's (or the MLP's) gradient only. The leaves' gradients
-- are then, slot by slot, d metric / d (residual) through that input alone
-- (its norm and projection included). Returns per layer {slot = {pre, mid}}.
local function input_gradients(model, ids, mask, parts, grads, slots, S, first_pre, embed, where)
  local B = ids:size(1)
  local function copies(t) local c = {} for s = 1, S do c[s] = t end return torch.cat(c, 1) end
  local stacked, stacked_mask = copies(ids), mask and copies(mask)
  local leaves, seen = {}, {}
  scope.run(model, function()
    for i, part in ipairs(parts) do
      leaves[i], seen[i] = {}, {}
      local function leaf(key)
        return function(t)
          local v = (i == 1 and key == 'pre' and embed) and torch.cat((function() local c = {} for s = 1, S do c[s] = embed end return c end)(), 1) or t
          local l = v:detach():clone():requires_grad_(true)
          leaves[i][key] = l
          return l
        end
      end
      hooks.replace(model, part.pre, leaf('pre'))
      if part.mid then hooks.replace(model, part.mid, leaf('mid')) end
      for _, role in ipairs(ROLES) do
        hooks.replace(model, part.attn .. '.' .. role, function(t) seen[i][role] = t return t end)
      end
      if part.mlp then hooks.replace(model, part.mlp, function(t) seen[i].mlp = t return t end) end
    end
    inputs.forward(model, stacked, stacked_mask, where)
    local total
    local function add(term) total = total and total + term or term end
    for i, part in ipairs(parts) do
      for _, role in ipairs(ROLES) do
        local g = grads[part.attn .. '.' .. role]
        local at = seen[i][role]
        local spread = torch.zeros_like(at)
        for s, slot in ipairs(slots[i]) do
          if slot.role == role then
            spread:narrow(1, (s - 1) * B + 1, B):narrow(3, slot.head, 1):copy_(g:narrow(3, slot.head, 1))
          end
        end
        add((at * spread):sum())
      end
      if part.mlp then
        local spread = torch.zeros_like(seen[i].mlp)
        for s, slot in ipairs(slots[i]) do
          if slot.role == 'mlp' then spread:narrow(1, (s - 1) * B + 1, B):copy_(grads[part.mlp]) end
        end
        add((seen[i].mlp * spread):sum())
      end
    end
    total:backward()
  end)
  local out = {}
  for i in ipairs(parts) do
    out[i] = {}
    for s in ipairs(slots[i]) do
      local function part_of(l) return l and l.grad and l.grad:narrow(1, (s - 1) * B + 1, B) or nil end
      out[i][s] = {pre = part_of(leaves[i].pre), mid = part_of(leaves[i].mid)}
    end
  end
  return out
end

-- The upstream outputs' clean - corrupt differences must add up to each
-- layer's residual stream difference: else the block writes something
-- edge attribution does not see (a post-norm block, a gate), and it refuses.
local function check_residual(parts, last, clean, corrupt, deltas, where)
  local sum = deltas[1].delta:double()
  local function compare(name)
    local want = (clean[name] - corrupt[name]):double()
    local off = (want - sum):abs():max():item()
    local scale = clean[name]:double():abs():max():item()
    if off > 1e-4 * (1 + scale) then
      error(("%s: %s differs between the runs by %.4g more than the embedding's, the heads' and the MLPs' outputs add up to: "
        .. "edge attribution needs a residual stream that is their sum (pre-norm blocks)"):format(where, name, off), 0)
    end
  end
  local k = 2
  for i, part in ipairs(parts) do
    if i > 1 then compare(part.pre) end
    while deltas[k] and deltas[k].layer == i and deltas[k].kind == 'head' do sum = sum + deltas[k].delta:double() k = k + 1 end
    if part.mid then compare(part.mid) end
    if deltas[k] and deltas[k].layer == i and deltas[k].kind == 'mlp' then sum = sum + deltas[k].delta:double() k = k + 1 end
  end
  compare(last)
end

-- patching.edges(model, clean, corrupt, metric, {method = 'eap'|'eap-ig',
-- steps = 8, tokenizer}) -> graph: edge attribution patching. Upstream
-- nodes: the embedding, every head, every MLP; downstream: every head's
-- query, key and value, every MLP's input, the logits. Each edge's score is
--   (clean - corrupt output of u) . d metric / d (the residual stream v reads, along v only)
-- summed over the batch and positions: the linear estimate of the metric's
-- change when only that edge carries the clean run (eap: the gradient on
-- the corrupt run; eap-ig: averaged over `steps` runs whose embedding goes
-- from the corrupt one to the clean one, midpoints). metric(logits) must
-- return a one-element tensor (patching.logit_diff does). graph.edges
-- (largest |score| first: from, to, via, score), graph:prune{top = k |
-- threshold = x}, print(graph), graph:svg(), graph:report(path). Needs
-- blocks whose residual stream is the sum of those outputs (checked).
function edges.edges(model, clean, corrupt, metric, opts)
  local where = 'patching.edges'
  hooks.require_clean(model, where, 2)
  opts = options.check(opts, {'method', 'steps', 'tokenizer', 'padding_side', 'attention_mask'}, where, 2)
  if type(metric) ~= 'function' then error(('%s: metric must be a function(logits) -> a one-element tensor, got %s'):format(where, type(metric)), 2) end
  local method = opts.method or 'eap'
  if method ~= 'eap' and method ~= 'eap-ig' then error(("%s: method must be 'eap' or 'eap-ig', got '%s'"):format(where, tostring(method)), 2) end
  local steps = options.whole(opts.steps, 'steps', where, 8)
  if opts.steps ~= nil and method ~= 'eap-ig' then error(("%s: steps is for method = 'eap-ig'"):format(where), 2) end
  local clean_ids, corrupt_ids, mask = runs.id_pair(model, clean, corrupt, opts, where)
  local parts, last = layer_parts(model, where)
  -- in eval mode; the parameters' .grad (a backward adds into them), modes
  -- and hooks come back as they were, after an error too
  return scope.run(model, function()
    -- the upstream outputs and the residual stream, in both runs
    local wanted = {last}
    for _, part in ipairs(parts) do
      for _, n in ipairs{part.pre, part.mid, part.attn .. '.result', part.mlp} do wanted[#wanted + 1] = n end
    end
    local clean_out, clean_cache = Cache.run_with_cache(model, clean_ids, {filter = wanted, attention_mask = mask})
    local corrupt_out, corrupt_cache = Cache.run_with_cache(model, corrupt_ids, {filter = wanted, attention_mask = mask})
    local clean_metric, corrupt_metric = runs.as_number(metric(clean_out, mask), where), runs.as_number(metric(corrupt_out, mask), where)
    local first_pre = parts[1].pre
    local deltas = {{name = 'embed', kind = 'embed', layer = 0, delta = clean_cache[first_pre] - corrupt_cache[first_pre]}}
    for i, part in ipairs(parts) do
      local r = clean_cache[part.attn .. '.result'] - corrupt_cache[part.attn .. '.result']  -- (B, T, H, C)
      for h = 1, r:size(3) do
        deltas[#deltas + 1] = {name = ('%s head %d'):format(part.name, h), kind = 'head', layer = i, head = h, delta = r:select(3, h)}
      end
      if part.mlp then
        deltas[#deltas + 1] = {name = part.name .. ' mlp', kind = 'mlp', layer = i, delta = clean_cache[part.mlp] - corrupt_cache[part.mlp]}
      end
    end
    check_residual(parts, last, clean_cache, corrupt_cache, deltas, where)
    -- the downstream slots of each layer, and the points whose gradient they need
    local slots, grad_names, S = {}, {last}, 1
    for i, part in ipairs(parts) do
      slots[i] = {}
      for _, role in ipairs(ROLES) do grad_names[#grad_names + 1] = part.attn .. '.' .. role end
      if part.mlp then grad_names[#grad_names + 1] = part.mlp end
    end
    -- the gradients: one corrupt run (eap) or `steps` runs along the embedding's way to clean (eap-ig)
    local alphas = {}
    if method == 'eap' then alphas[1] = 0 else for k = 1, steps do alphas[k] = (k - 0.5) / steps end end
    local sums, logit_grad
    for _, alpha in ipairs(alphas) do
      local embed = alpha ~= 0 and (corrupt_cache[first_pre] + deltas[1].delta * alpha):detach() or nil
      local m, kept = forward_kept(model, corrupt_ids, mask, metric, grad_names, first_pre, embed, where)
      m:backward()
      local grads = {}
      for _, name in ipairs(grad_names) do
        local t = kept[name]
        if t == nil or t.grad == nil then error(("%s: no gradient reached '%s' (does the metric depend on it?)"):format(where, name), 0) end
        grads[name] = t.grad
      end
      if #slots[1] == 0 then  -- the heads each role has, from the first run's gradients
        for i, part in ipairs(parts) do
          for _, role in ipairs(ROLES) do
            for h = 1, grads[part.attn .. '.' .. role]:size(3) do slots[i][#slots[i] + 1] = {role = role, head = h} end
          end
          if part.mlp then slots[i][#slots[i] + 1] = {role = 'mlp'} end
          S = math.max(S, #slots[i])
        end
      end
      local g = input_gradients(model, corrupt_ids, mask, parts, grads, slots, S, first_pre, embed, where)
      logit_grad = logit_grad and logit_grad + grads[last] or grads[last]
      if not sums then sums = g
      else
        for i in ipairs(parts) do
          for s, pair in ipairs(g[i]) do
            for _, key in ipairs{'pre', 'mid'} do
              if pair[key] then sums[i][s][key] = sums[i][s][key] + pair[key] end
            end
          end
        end
      end
    end
    local n = #alphas
    -- the scores: each upstream difference against each downstream gradient it reaches
    local kv_named = {}
    for i, part in ipairs(parts) do
      local q_heads, k_heads = 0, 0
      for _, slot in ipairs(slots[i]) do
        if slot.role == 'q' then q_heads = q_heads + 1 elseif slot.role == 'k' then k_heads = k_heads + 1 end
      end
      kv_named[i] = k_heads ~= q_heads
    end
    local list = {}
    local function dot(delta, grad) return (delta:double() * grad:double()):sum():item() / n end
    for i, part in ipairs(parts) do
      for s, slot in ipairs(slots[i]) do
        local grad = sums[i][s]
        local to, via
        if slot.role == 'mlp' then to, via = part.name .. ' mlp', nil
        else
          to = (slot.role ~= 'q' and kv_named[i]) and ('%s kv head %d'):format(part.name, slot.head) or ('%s head %d'):format(part.name, slot.head)
          via = slot.role
        end
        for _, u in ipairs(deltas) do
          local score
          if u.layer < i then
            score = (grad.pre and dot(u.delta, grad.pre) or 0) + (grad.mid and dot(u.delta, grad.mid) or 0)
          elseif u.layer == i and u.kind == 'head' and slot.role == 'mlp' and grad.mid then
            score = dot(u.delta, grad.mid)
          end
          if score then list[#list + 1] = {from = u.name, to = to, via = via, score = score} end
        end
      end
    end
    for _, u in ipairs(deltas) do
      list[#list + 1] = {from = u.name, to = 'logits', score = dot(u.delta, logit_grad)}
    end
    local nodes = {}
    for _, u in ipairs(deltas) do nodes[#nodes + 1] = {name = u.name, kind = u.kind, layer = u.layer, head = u.head} end
    for i, part in ipairs(parts) do
      if kv_named[i] then
        local q_heads, kv_heads = 0, 0
        for _, slot in ipairs(slots[i]) do
          if slot.role == 'q' then q_heads = q_heads + 1 elseif slot.role == 'k' then kv_heads = kv_heads + 1 end
        end
        for _, slot in ipairs(slots[i]) do
          if slot.role == 'k' then  -- the query heads that read this key and value head (grouped-query attention)
            local group, per = {}, q_heads / kv_heads
            for h = (slot.head - 1) * per + 1, slot.head * per do group[#group + 1] = ('%s head %d'):format(part.name, h) end
            nodes[#nodes + 1] = {name = ('%s kv head %d'):format(part.name, slot.head), kind = 'kv', layer = i, head = slot.head, group = group}
          end
        end
      end
    end
    nodes[#nodes + 1] = {name = 'logits', kind = 'logits', layer = #parts + 1}
    return edges.graph(nodes, list, {clean = clean_metric, corrupt = corrupt_metric, method = method,
      steps = method == 'eap-ig' and steps or nil, layers = #parts})
  end, {mode = 'eval', grads = true})
end

-- The edges sorted by |score|, largest first (ties by name, so the order is
-- the same on every run).
local function sorted(list)
  table.sort(list, function(a, b)
    local x, y = math.abs(a.score), math.abs(b.score)
    if x ~= y then return x > y end
    if a.from ~= b.from then return a.from < b.from end
    if a.to ~= b.to then return a.to < b.to end
    return (a.via or '') < (b.via or '')
  end)
  return list
end

-- edges.graph(nodes, list, info) -> a Graph of those nodes and edges
function edges.graph(nodes, list, info)
  local g = setmetatable({nodes = nodes, edges = sorted(list), clean = info.clean, corrupt = info.corrupt, method = info.method,
    steps = info.steps, layers = info.layers, pruned = info.pruned}, Graph)
  return g
end

-- graph:score(from, to, via) -> the edge's score (an error for an edge the
-- graph does not have)
function Graph:score(from, to, via)
  for _, e in ipairs(self.edges) do
    if e.from == from and e.to == to and e.via == via then return e.score end
  end
  error(("graph:score: no edge %s -> %s%s"):format(tostring(from), tostring(to), via and (' via ' .. via) or ''), 2)
end

-- graph:prune{top = k | threshold = x} -> a new graph: the k edges of
-- largest |score| (or those with |score| >= x), then only the edges on a
-- path to the logits through the kept ones (an edge into a node nothing
-- kept reads from carries nothing to the metric).
function Graph:prune(opts)
  local where = 'graph:prune'
  opts = options.check(opts, {'top', 'threshold'}, where, 2)
  if (opts.top == nil) == (opts.threshold == nil) then error(('%s: give one of top or threshold'):format(where), 2) end
  local keep = {}
  if opts.top ~= nil then
    if type(opts.top) ~= 'number' or opts.top % 1 ~= 0 or opts.top < 1 then
      error(('%s: top must be a positive integer, got %s'):format(where, tostring(opts.top)), 2)
    end
    for i = 1, math.min(opts.top, #self.edges) do keep[#keep + 1] = self.edges[i] end
  else
    local t = opts.threshold
    if type(t) ~= 'number' or t ~= t or t < 0 then error(('%s: threshold must be a number >= 0, got %s'):format(where, tostring(t)), 2) end
    for _, e in ipairs(self.edges) do if math.abs(e.score) >= t then keep[#keep + 1] = e end end
  end
  -- which nodes reach the logits through kept edges: a head reached via q, k or v is the head
  local groups = {}
  for _, n in ipairs(self.nodes) do if n.group then groups[n.name] = n.group end end
  local reaches = {logits = true}
  local function reaching(name)  -- a key and value head reaches the logits through any query head of its group
    if reaches[name] then return true end
    for _, h in ipairs(groups[name] or {}) do if reaches[h] then return true end end
    return false
  end
  local changed = true
  while changed do
    changed = false
    for _, e in ipairs(keep) do
      if reaching(e.to) and not reaches[e.from] then reaches[e.from], changed = true, true end
    end
  end
  local out = {}
  for _, e in ipairs(keep) do if reaching(e.to) then out[#out + 1] = {from = e.from, to = e.to, via = e.via, score = e.score} end end
  return edges.graph(self.nodes, out, {clean = self.clean, corrupt = self.corrupt, method = self.method, steps = self.steps,
    layers = self.layers, pruned = (opts.top and ('the top %d'):format(opts.top) or ('|score| >= %g'):format(opts.threshold)) .. ' on a path to the logits'})
end

local function label(e) return e.via and ('%s -> %s (%s)'):format(e.from, e.to, e.via) or ('%s -> %s'):format(e.from, e.to) end

function Graph:__tostring()
  local head = ('edge attribution (%s%s): %s edges%s; metric clean %.4g, corrupt %.4g'):format(self.method,
    self.steps and (', %d steps'):format(self.steps) or '', format.count(#self.edges), self.pruned and (', pruned to ' .. self.pruned) or '',
    self.clean, self.corrupt)
  local lines = {head, ('%-48s %12s'):format('edge', 'score')}
  for i = 1, math.min(20, #self.edges) do
    local e = self.edges[i]
    lines[#lines + 1] = ('%-48s %+12.4g'):format(terminal.token_label(label(e), 48), e.score)
  end
  if #self.edges > 20 then lines[#lines + 1] = ('... %s more (graph.edges)'):format(format.count(#self.edges - 20)) end
  return table.concat(lines, '\n')
end

-- graph:svg() -> the graph drawn by layer (charts.graph): the embedding at
-- the bottom, each layer's heads then its MLP, the logits on top; an edge
-- into a head ends at its q, k or v; blue for a positive score, red for a
-- negative one, width by |score|. At most 400 edges (prune first).
function Graph:svg()
  if #self.edges > 400 then
    error(('graph:svg: %s edges are too many to draw; graph:prune{top = 50} (or a threshold) first'):format(format.count(#self.edges)), 2)
  end
  local note = ('%s; metric clean %.4g, corrupt %.4g; each edge: the estimated change of the metric when only it carries the clean run'):format(
    self.method .. (self.steps and (', %d steps'):format(self.steps) or ''), self.clean, self.corrupt)
  return charts.graph(('Edge attribution%s'):format(self.pruned and (' (' .. self.pruned .. ')') or ''), self.nodes, self.edges, {note = note})
end

-- graph:report(path) -> path: a self-contained HTML page with the drawing
-- and its edges as a table (written atomically)
function Graph:report(path)
  local written = result.write(path, page.new('Edge attribution', self:svg()), 'graph:report')  -- render/result.lua
  return written
end

hooks.analysis(edges.edges)

return edges
