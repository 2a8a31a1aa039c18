-- The autopsy of a mixture of experts: for each layer holding an nn.MoE
-- (its MLP by block_role, or any nn.MoE inside the layer), whatever the
-- family, the router's entropy, each expert's load, the dead experts, the
-- loss with each expert removed and with the router's top-1 in place of its
-- top-k. Rows gain the measures of the registry's 'moe' phase (measures.lua);
-- a.moe holds each expert's numbers and verdict (verdicts.experts). A model
-- without an nn.MoE gains nothing: its autopsy is as before.
local torch = require('anatomy.torch')
local nn = require('anatomy.nn')
local probe = require('anatomy.probe')
local roles = require('anatomy.probe.roles')
local measure = require('anatomy.autopsy.measure')
local verdicts = require('anatomy.autopsy.verdicts')
local charts = require('anatomy.render.charts')
local format = require('anatomy.render.format')

local moe = {}

-- moe.layers(layers) -> {{index = i, name = the layer's, path = the MoE's,
-- block = the nn.MoE}, ...}: each layer (model:layers()) that holds one,
-- its MLP (the child declaring block_role = 'mlp') first
function moe.layers(layers)
  local out = {}
  for i, l in ipairs(layers) do
    local child = roles.child(l[2], 'mlp')
    local m, path = child and l[2][child], child and (l[1] .. '.' .. child)
    if not (m and nn.is_instance(m, nn.MoE)) then
      m, path = nil, nil
      for n, c in l[2]:named_modules() do
        if nn.is_instance(c, nn.MoE) then m, path = c, n == '' and l[1] or (l[1] .. '.' .. n); break end
      end
    end
    if m then out[#out + 1] = {index = i, name = l[1], path = path, block = m} end
  end
  return out
end

-- One forward without gradients over the measured batches, reading each
-- router's logits at the real positions: the mean entropy of its softmax
-- (nats), and how many of the tokens' top-k slots each expert got, as the
-- block's own route() picks them.
local function routers(s, found, loss_with)
  local sums = {}
  for k, f in ipairs(found) do
    local E = f.block.num_experts
    sums[k] = {tokens = 0, entropy = 0, slots = {}}
    for e = 1, E do sums[k].slots[e] = 0 end
  end
  loss_with(s, function()
    local hs = {}
    for k, f in ipairs(found) do
      local E, sum = f.block.num_experts, sums[k]
      hs[k] = probe.replace(s.model, f.path .. '.router_logits', function(t)
        local logits = measure.real_rows(t:detach(), s.idx):reshape(-1, E):float()  -- (N, E)
        local p, logp = logits:softmax(-1), logits:log_softmax(-1)
        sum.entropy = sum.entropy - (p * logp):masked_fill(p:le(0), 0):double():sum():item()
        sum.tokens = sum.tokens + logits:size(1)
        local _, idx = f.block:route(logits)  -- (N, K), 1-based
        local n = idx:numel()
        local counts = torch.zeros(E, {dtype = 'float64', device = idx.device}):scatter_add(1, idx:reshape(n),
          torch.ones(n, {dtype = 'float64', device = idx.device})):tolist()
        for e = 1, E do sum.slots[e] = sum.slots[e] + counts[e] end
      end)
    end
    return hs
  end)
  for k, f in ipairs(found) do
    local sum, row, E = sums[k], s.block_rows[f.index], f.block.num_experts
    if sum.tokens > 0 then
      local slots = sum.tokens * f.block.top_k
      row.router_entropy = sum.entropy / sum.tokens
      row.router_entropy_ratio = E > 1 and row.router_entropy / math.log(E) or nil
      row.expert_tokens, row.expert_load = {}, {}
      local most = 0
      for e = 1, E do
        row.expert_tokens[e] = sum.slots[e]
        row.expert_load[e] = sum.slots[e] / slots
        most = math.max(most, row.expert_load[e])
      end
      row.expert_load_max = most
    end
  end
end

-- The loss with each expert of each MoE layer removed in turn (the router
-- as if it were not there: moe:set_routing{removed = {e}}; when fewer than
-- top_k experts would remain, it takes all the others), then with each
-- layer's router at top-1 (moe:set_routing{top_k = 1}), then with every
-- layer's at top-1 together. Stepwise, from the layer's own input.
local function losses(s, a, found, loss_with, from_block)
  for _, f in ipairs(found) do
    local m, row = f.block, s.block_rows[f.index]
    local from = from_block(s, f.index)
    local function with(routing) return loss_with(s, function() return {m:set_routing(routing)} end, from) end
    if m.num_experts > 1 then
      row.expert_removal_loss = {}
      local k = math.min(m.top_k, m.num_experts - 1)
      for e = 1, m.num_experts do row.expert_removal_loss[e] = with{removed = {e}, top_k = k} end
    end
    row.top1_loss = with{top_k = 1}
  end
  a.moe.top1_loss = loss_with(s, function()
    local hs = {}
    for k, f in ipairs(found) do hs[k] = f.block:set_routing{top_k = 1} end
    return hs
  end, from_block(s, found[1].index))
end

-- moe.run(s, a, loss_with, from_block): autopsy.run's MoE phase (run.lua's
-- state, its loss over the measured batches with interventions, and its
-- stepwise start from a block). Nothing when no layer holds an nn.MoE.
function moe.run(s, a, loss_with, from_block)
  local found = moe.layers(s.layers)
  if #found == 0 then return end
  for k, v in pairs(verdicts.expert_thresholds) do s.thresholds[k] = (s.opts.thresholds or {})[k] or v end
  a.moe = {layers = {}}
  for k, f in ipairs(found) do
    a.moe.layers[k] = {name = f.name, path = f.path, experts = f.block.num_experts, top_k = f.block.top_k,
      norm_topk_prob = f.block.norm_topk_prob}
  end
  routers(s, found, loss_with)  -- always (one forward), as grad_norm and act_std are
  if s.want.removal then losses(s, a, found, loss_with, from_block) end
end

-- The MoE rows of a (those with an expert_load or expert_removal_loss), in order.
local function moe_rows(a)
  local out = {}
  for _, r in ipairs(a.rows) do if r.expert_load or r.expert_removal_loss then out[#out + 1] = r end end
  return out
end

-- moe.lines(a) -> the lines under the terminal table: every layer's router
-- at top-1, then a line a layer naming its dead and passenger experts with
-- what removing each costs (the first 8; all in a.moe.experts)
function moe.lines(a)
  if not a.moe then return {} end
  local out = {}
  if a.moe.top1_loss then
    out[#out + 1] = ('with every router\'s top-1 in place of its top-k: loss %s (full model %s)'):format(
      format.number(a.moe.top1_loss, 4), format.number(a.loss, 4))
  end
  local by_layer, order = {}, {}
  for _, x in ipairs(a.moe.experts or {}) do
    if x.verdict ~= 'worker' then
      if not by_layer[x.layer] then by_layer[x.layer] = {}; order[#order + 1] = x.layer end
      local list = by_layer[x.layer]
      list[#list + 1] = ('expert %d %s (load %s%s)'):format(x.expert, x.verdict, format.number(x.load),
        x.rise and (', removing it %+.3g nats'):format(x.rise) or '')
    end
  end
  for _, layer in ipairs(order) do
    local list = by_layer[layer]
    local shown = {unpack(list, 1, math.min(#list, 8))}
    out[#out + 1] = ('%s: %s%s'):format(layer, table.concat(shown, '; '), #list > 8 and ('; and %d more'):format(#list - 8) or '')
  end
  return out
end

-- moe.charts(a) -> the report's MoE charts (SVG strings): each expert's
-- load (layer x expert), the loss rise with each expert removed, the
-- router's entropy and the top-1 loss per layer
function moe.charts(a)
  local rows = moe_rows(a)
  if #rows == 0 then return {} end
  local names, E = {}, 0
  for i, r in ipairs(rows) do names[i] = r.name; E = math.max(E, #(r.expert_load or r.expert_removal_loss)) end
  local experts = {}
  for e = 1, E do experts[e] = tostring(e) end
  local out = {}
  local function matrix(value)
    local m, any = {}, false
    for i, r in ipairs(rows) do
      m[i] = {}
      for e = 1, E do m[i][e] = value(r, e); any = any or m[i][e] ~= nil end
    end
    return any and m
  end
  local load = matrix(function(r, e) return r.expert_load and r.expert_load[e] end)
  if load then  -- the colour scale 0..2/E: pale at the uniform share, blue below it (a dead expert the deepest), red above
    out[#out + 1] = charts.heatmap('expert load: layer x expert (share of the routed top-k slots)', names, experts, load, false,
      {xlabel = 'expert', ylabel = 'layer', value = 'load (pale: 1/E)', range = {0, 2 / E},
        note = ('each cell: the share of the tokens\' top-k slots routed to that expert; pale is uniform routing, 1/E = %s; '
          .. 'blue below it (a dead expert the deepest), red above (2/E and over the reddest)'):format(format.number(1 / E))})
  end
  local rise = matrix(function(r, e) return r.expert_removal_loss and r.expert_removal_loss[e] and a.loss and r.expert_removal_loss[e] - a.loss end)
  if rise then
    out[#out + 1] = charts.heatmap('expert removal: how much the loss rises with each expert removed', names, experts, rise, false,
      {xlabel = 'expert', ylabel = 'layer', value = 'loss rise (nats)',
        note = ('each cell: the loss with that expert removed (the router as if it were not there) minus the full model\'s %s')
          :format(format.number(a.loss, 4))})
  end
  local entropy, top1 = {}, {}
  for i, r in ipairs(rows) do entropy[i], top1[i] = r.router_entropy, r.top1_loss and a.loss and r.top1_loss - a.loss end
  if next(entropy) then
    out[#out + 1] = charts.bars('router_entropy per MoE layer', names, entropy, {ylabel = 'router_entropy (nats)', xlabel = 'layer',
      note = ('the mean entropy of the router\'s softmax over the tokens; uniform routing over E = %d experts is log E = %s nats')
        :format(E, format.number(math.log(E), 4))})
  end
  if next(top1) then
    out[#out + 1] = charts.bars('top1_loss: how much the loss rises with the router\'s top-1 in place of its top-k', names, top1,
      {ylabel = 'top1_loss - loss (nats)', xlabel = 'layer', offset = a.loss,
        note = ('each bar: the loss with that layer\'s router at top-1 minus the full model\'s %s'):format(format.number(a.loss, 4))})
  end
  return out
end

return moe
