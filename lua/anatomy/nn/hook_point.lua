-- A block's hook points as the block declares them, where it is written:
-- each point's name, the layout of its tensor (its dimensions by name) and
-- what recording it costs. Probes (lua/anatomy/probe/points.lua) read this
-- rather than guess a point's shape from its name.
--   Block.declares = {nn.point('resid_mid', nn.layouts.stream), ...}
-- Block.hook_names = {'resid_mid', ...} still declares points by name alone:
-- each of them a point of the residual stream's layout, free to record.
local nn = require('anatomy.nn')

-- The layouts the blocks use: the dimensions of the tensor in order.
nn.layouts = {
  stream = {'batch', 'pos', 'd_model'},           -- the residual stream; a norm's output
  scale = {'batch', 'pos', 'one'},                -- a norm's divisor
  heads = {'batch', 'pos', 'head', 'd_head'},      -- q, k, v, z: each head's vectors
  pattern = {'batch', 'head', 'pos', 'key_pos'},  -- scores, pattern: the query position third
  result = {'batch', 'pos', 'head', 'd_model'},   -- each head's share of the attention's output
  hidden = {'batch', 'pos', 'd_mlp'},             -- an MLP's hidden layer
}

-- What recording a point costs, beyond the tensor itself: 'free' (a Lua
-- block's point, one table lookup), 'unfused' (a built-in block leaves its
-- fused path for its explicit one while any of its points is hooked),
-- 'asked' (computed only where a probe names the point: an attention's
-- per-head result, H times its output's memory).
local costs = {free = true, unfused = true, asked = true}

local Point = {}
Point.__index = Point
function Point:__tostring()
  return ('hook point %s (%s), %s'):format(self.name, table.concat(self.layout, ', '), self.cost)
end

-- nn.point(name, layout[, cost = 'free']) -> the declaration of one hook
-- point: layout a list of dimension names ('batch' and 'pos' where they lie;
-- 'head' where heads do), cost 'free', 'unfused' or 'asked' (above)
function nn.point(name, layout, cost)
  if type(name) ~= 'string' or name == '' then
    error(('nn.point: name must be a non-empty string, got %s'):format(type(name)), 2)
  end
  if type(layout) ~= 'table' or #layout == 0 then
    error(("nn.point: '%s': layout must be a list of dimension names, got %s"):format(name, type(layout)), 2)
  end
  for i, d in ipairs(layout) do
    if type(d) ~= 'string' then error(("nn.point: '%s': layout[%d] must be a string, got %s"):format(name, i, type(d)), 2) end
  end
  cost = cost or 'free'
  if not costs[cost] then error(("nn.point: '%s': cost must be 'free', 'unfused' or 'asked', got %s"):format(name, tostring(cost)), 2) end
  return setmetatable({name = name, layout = layout, cost = cost}, Point)
end

-- nn.declared_points(m) -> the declarations of module m's hook points (its
-- class's declares, or its hook_names as stream points), nil when it declares none
function nn.declared_points(m)
  local declared = m.declares
  if type(declared) == 'table' then return declared end
  local names = m.hook_names
  if type(names) ~= 'table' then return nil end
  local out = {}
  for i, n in ipairs(names) do out[i] = nn.point(n, nn.layouts.stream) end
  return out
end

return nn.point
