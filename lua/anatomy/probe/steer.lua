-- steer: steering vectors (activation addition). A direction in each chosen
-- layer's activations is read off two sets of contrasting texts (the mean of
-- one set's activations minus the other's, or the first principal direction
-- of their paired differences), then added back, scaled, while the model
-- runs: in a forward, in probe.run_with_cache, in model:generate at every
-- step. steer.apply returns a handle (handle:remove(), and probe.clear
-- removes it too): one intervention among the others, through the one attach
-- mechanism (probe/hooks.lua).
local torch = require('anatomy.torch')
local points = require('anatomy.probe.points')
local hooks = require('anatomy.probe.hooks')
local scope = require('anatomy.probe.scope')
local inputs = require('anatomy.probe.inputs')
local Cache = require('anatomy.probe.cache')
local options = require('anatomy.torch.options')
local format = require('anatomy.render.format')
local nn = require('anatomy.nn')

local steer = {}
local Vector = {}
Vector.__index = Vector
Vector.__typename = 'steer.Vector'
steer.Vector = Vector

-- The layers a steering vector is read at or applied to: {{name, full}, ...}
-- in the model's order, full being '<layer>.<point>' (checked to exist).
local function targets(model, point, layers, where)
  local chosen, all = points.pick_layers(model, layers, where, 3)
  local out = {}
  for _, i in ipairs(chosen) do
    local full = all[i][1] .. '.' .. point
    local ok, why_not = pcall(points.locate, model, full, 1)
    if not ok then
      error(("%s: layer %s has no '%s' (%s)"):format(where, all[i][1], point, tostring(why_not):gsub('^[^\n]-:%d+: ', '')), 3)
    end
    out[#out + 1] = {all[i][1], full}
  end
  return out
end

-- The examples of one side: a list of texts or of id tensors, or one (B, T)
-- ids tensor (a row an example); each becomes (1, T) ids.
local function examples(model, side, what, tok, where)
  local list = {}
  if torch.is_tensor(side) then
    local ids = inputs.to_ids(model, side, tok, where)
    for b = 1, ids:size(1) do list[b] = ids:narrow(1, b, 1) end
  elseif type(side) == 'table' and #side > 0 then
    for i, x in ipairs(side) do
      local ok, ids = pcall(inputs.to_ids, model, x, tok, where)
      if not ok then error(('%s: %s[%d]: %s'):format(where, what, i, tostring(ids):gsub('^[^\n]-:%d+: ', '')), 3) end
      if ids:size(1) ~= 1 then error(('%s: %s[%d] must be one example, got a batch of %d'):format(where, what, i, ids:size(1)), 3) end
      list[i] = ids
    end
  else
    error(('%s: %s must be a list of texts (or of token ids) or a (B, T) ids tensor, got %s'):format(where, what,
      type(side) == 'table' and 'an empty list' or type(side)), 3)
  end
  return list
end

-- Each example's activation at every target, reduced over positions:
-- {[full] = (N, C)}.
local function activations(model, list, where_list, reduce)
  local names = {}
  for i, t in ipairs(where_list) do names[i] = t[2] end
  local rows = {}
  for _, t in ipairs(where_list) do rows[t[2]] = {} end
  for i, ids in ipairs(list) do
    local _, cache = Cache.run_with_cache(model, ids, {filter = names})
    for _, t in ipairs(where_list) do
      local a = cache:get(t[2])
      if a == nil or a:dim() ~= 3 then
        error(("steer.vector: '%s' is not a (B, T, C) activation here (got %s)"):format(t[2], a and format.shape(a) or 'nothing'), 0)
      end
      a = a[1]:double()  -- (T, C), in float64: the means below lose nothing to the sums
      rows[t[2]][i] = reduce == 'last' and a[a:size(1)] or a:mean(1)
    end
  end
  local out = {}
  for _, t in ipairs(where_list) do out[t[2]] = torch.stack(rows[t[2]], 1) end
  return out
end

-- steer.vector(model, positive, negative, {point = 'resid_post', layers,
-- method = 'mean'|'pca', reduce = 'mean'|'last', tokenizer}) -> steer.Vector
-- positive and negative: lists of texts (or token ids), or (B, T) ids
-- tensors; texts of any lengths, each run alone. At each layer (all of
-- model:layers() unless layers names some), each example's activation at
-- point is reduced over its positions (their mean, or the last one's), and
--   mean: the positive examples' mean minus the negative ones' (activation
--         addition's mean difference);
--   pca:  the first principal direction of the paired differences
--         positive[i] - negative[i] (centred; equal counts), oriented along
--         their mean and scaled to the mean's length along it.
-- v.vectors[layer] is the (C) direction (float32, on the model's device);
-- steer.apply adds it back.
function steer.vector(model, positive, negative, opts)
  local where = 'steer.vector'
  opts = options.check(opts, {point = true, layers = true, method = true, reduce = true, tokenizer = true}, where, 2)
  local point = opts.point or 'resid_post'
  if type(point) ~= 'string' or point == '' then error(('%s: point must be a hook point name, got %s'):format(where, tostring(point)), 2) end
  local method = opts.method or 'mean'
  if method ~= 'mean' and method ~= 'pca' then error(("%s: method must be 'mean' or 'pca', got %s"):format(where, tostring(method)), 2) end
  local reduce = opts.reduce or 'mean'
  if reduce ~= 'mean' and reduce ~= 'last' then error(("%s: reduce must be 'mean' or 'last', got %s"):format(where, tostring(reduce)), 2) end
  local list = targets(model, point, opts.layers, where)
  local tok = opts.tokenizer or rawget(model, 'tokenizer')
  local pos, neg = examples(model, positive, 'positive', tok, where), examples(model, negative, 'negative', tok, where)
  if method == 'pca' and #pos ~= #neg then
    error(('%s: pca pairs the examples: positive has %d, negative %d'):format(where, #pos, #neg), 2)
  end
  if method == 'pca' and #pos < 2 then error(('%s: pca needs at least two pairs, got %d'):format(where, #pos), 2) end
  local a_pos, a_neg = scope.run(model, function()
    return activations(model, pos, list, reduce), activations(model, neg, list, reduce)
  end, {mode = 'eval'})
  local self = setmetatable({model = nn.typename(model), point = point, method = method, reduce = reduce, layers = {}, vectors = {},
    positive = #pos, negative = #neg}, Vector)
  for _, t in ipairs(list) do
    local p, n = a_pos[t[2]], a_neg[t[2]]
    local v
    if method == 'mean' then
      v = p:mean(1) - n:mean(1)
    else
      local d = p - n                                     -- (N, C): the pairs' differences
      local mean = d:mean(1)
      local _, _, vh = torch.linalg.svd(d - mean, false)
      local dir = vh[1]                                   -- the first principal direction (unit length)
      local along = (mean * dir):sum():item()
      if along < 0 then dir, along = -dir, -along end
      v = dir * along
    end
    if not torch.isfinite(v):all():item() then
      error(("%s: the vector at %s is not finite (the activations hold NaN or Inf)"):format(where, t[2]), 2)
    end
    self.layers[#self.layers + 1] = t[1]
    self.vectors[t[1]] = v:float():to(model:device())
  end
  return self
end

function Vector:__tostring()
  local norms = {}
  for _, l in ipairs(self.layers) do norms[#norms + 1] = ('%s %s'):format(l, format.number(self.vectors[l]:norm():item(), 4)) end
  return ('steer.Vector(%s, %s of %d positive - %d negative examples (%s over positions); |v|: %s)'):format(
    self.point, self.method == 'mean' and 'mean difference' or 'first principal direction', self.positive, self.negative,
    self.reduce, table.concat(norms, ', '))
end

-- steer.apply(model, v, {coefficient = 1, layers, positions}) -> handle:
-- coefficient * v.vectors[layer] added to the activation at v.point in each
-- layer of v (or those layers names), at every position or at positions
-- (a number or a list; negative counts from the end), in every forward until
-- handle:remove() or probe.clear(model). Several apply calls add up.
function steer.apply(model, v, opts)
  local where = 'steer.apply'
  if getmetatable(v) ~= Vector then error(('%s: the vector must be a steer.Vector (steer.vector makes one), got %s'):format(where, type(v)), 2) end
  opts = options.check(opts, {coefficient = true, layers = true, positions = true}, where, 2)
  local c = opts.coefficient == nil and 1 or opts.coefficient
  if type(c) ~= 'number' or c ~= c or c == math.huge or c == -math.huge then
    error(('%s: coefficient must be a finite number, got %s'):format(where, tostring(c)), 2)
  end
  local positions = opts.positions
  if type(positions) == 'number' then positions = {positions} end
  if positions ~= nil then
    if type(positions) ~= 'table' or #positions == 0 then error(('%s: positions must be a number or a list of them, got %s'):format(where, type(positions)), 2) end
    for i, p in ipairs(positions) do
      if type(p) ~= 'number' or p % 1 ~= 0 or p == 0 then error(('%s: positions[%d] must be a non-zero integer, got %s'):format(where, i, tostring(p)), 2) end
    end
  end
  local layers = v.layers
  if opts.layers ~= nil then
    local chosen = targets(model, v.point, opts.layers, where)
    layers = {}
    for _, t in ipairs(chosen) do
      if not v.vectors[t[1]] then error(("%s: the vector has no direction for layer %s (it has: %s)"):format(where, t[1], table.concat(v.layers, ', ')), 2) end
      layers[#layers + 1] = t[1]
    end
  end
  local handles = {}
  for _, layer in ipairs(layers) do
    local full = layer .. '.' .. v.point
    local dir = v.vectors[layer]
    handles[#handles + 1] = hooks.replace(model, full, function(t)
      if t:size(-1) ~= dir:size(1) then
        error(("%s: '%s' has width %d here, the vector %d"):format(where, full, t:size(-1), dir:size(1)), 0)
      end
      if dir.dtype ~= t.dtype or dir.device ~= t.device then dir = dir:to(t.device):to(t.dtype) end
      local add = dir * c
      if not positions then return t + add end
      local out = t:clone()
      for _, p in ipairs(positions) do
        local q = inputs.position(p, t:size(2), where, full, -1)
        local view = out:narrow(2, q, 1)
        view:add_(add)
      end
      return out
    end)
  end
  return hooks.group(handles)
end

return steer
