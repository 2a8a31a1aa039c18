-- Transcoders in the model: where each layer's features read and write
-- (circuit-tracer's feature_input_hook and feature_output_hook, in
-- TransformerLens's names relative to a block), and sae.attach for a
-- sae.CLT: every MLP output replaced by what the features of that layer and
-- the earlier ones decode to, plus, with the error term, the true output
-- less that reconstruction.
-- B batch, T time, D the model's width, F features a layer, L layers.
local torch = require('anatomy.torch')
local nn = require('anatomy.nn')
local options = require('anatomy.torch.options')
local points = require('anatomy.probe.points')
local hooks = require('anatomy.probe.hooks')
local splice = require('anatomy.features.splice')
local M = {}

-- The input hooks read, and how anatomy reads them: the MLP's input
-- (circuit-tracer's mlp.hook_in, a parallel block's MLP input too), the
-- second norm's output as TransformerLens 2 (circuit-tracer's) publishes
-- it at ln2.hook_normalized (after a LayerNorm's weight and bias: the MLP's
-- input; an RMSNorm's normalized vectors before its weight), or the
-- residual itself.
M.inputs = {['ln2.hook_normalized'] = 'normalized', ['mlp.hook_in'] = 'mlp_input', hook_resid_mid = 'resid_mid'}
-- The output hooks: what the MLP adds to the stream (after a post-MLP norm
-- where the block has one), or the MLP module's own output.
M.outputs = {hook_mlp_out = 'mlp_out', ['mlp.hook_out'] = 'mlp'}

local function known(map)
  local names = {}
  for k in pairs(map) do names[#names + 1] = k end
  table.sort(names)
  return names
end

-- M.check_hooks(input, output, where, level): each a hook M knows, else an
-- error naming the closest
function M.check_hooks(input, output, where, level)
  for _, pair in ipairs{{'input_hook', input, M.inputs}, {'output_hook', output, M.outputs}} do
    local name, v, map = pair[1], pair[2], pair[3]
    if type(v) ~= 'string' or not map[v] then
      local list = known(map)
      local near = type(v) == 'string' and options.closest(v, list)
      error(("%s: %s must be one of %s, got %s%s"):format(where, name, table.concat(list, ', '), tostring(v),
        near and (" (did you mean '%s'?)"):format(near) or ''), level + 1)
    end
  end
end

-- M.locations(model, c, where, level) -> {{input, from_module_input, output}, ...}
-- a layer each: the point read (a module whose input is read, or a hook
-- point), and the point whose output the reconstruction replaces
function M.locations(model, c, where, level)
  level = level + 1
  local layers, why = model:layers()
  if not layers then error(('%s: %s'):format(where, why), level) end
  if #layers ~= c.cfg.n_layers then
    error(('%s: the transcoders have %d layers, the model %d'):format(where, c.cfg.n_layers, #layers), level)
  end
  local out = {}
  for l = 1, #layers do
    local ok, loc = pcall(function()
      local input_kind = M.inputs[c.cfg.input_hook]
      local input
      if input_kind == 'normalized' then
        -- an RMSNorm's normalized vectors (its hook point); a LayerNorm's output is the MLP's input
        local has_ln2, norm = pcall(points.part, model, l, 'ln2', 1)
        if has_ln2 and nn.typename(points.module(model, norm)) == 'nn.RMSNorm' then input = norm .. '.normalized' end
        input_kind = input and 'point' or 'mlp_input'
      end
      input = input or (input_kind == 'resid_mid' and points.resid(model, l, 'mid', 3) or points.part(model, l, 'mlp', 3))
      local output = M.outputs[c.cfg.output_hook] == 'mlp' and points.part(model, l, 'mlp', 3) or points.output(model, l, 'mlp', 3)
      return {input = input, from_module_input = input_kind == 'mlp_input', output = output}
    end)
    if not ok then error(('%s: layer %d: %s'):format(where, l, tostring(loc)), level) end
    out[l] = loc
  end
  return out
end

-- sae.attach(model, c, {error_term}) for a sae.CLT -> handle; see
-- features/init.lua. Each forward encodes every layer's input as the layer
-- is reached, and replaces layer m's MLP output by the decoding of layers
-- 1..m's features (the features as published: a probe that changes them
-- changes every later layer's reconstruction).
function M.attach(model, c, opts, where)
  opts = options.check(opts, {'error_term'}, where, 2)
  if opts.error_term ~= nil and type(opts.error_term) ~= 'boolean' then
    error(('%s: error_term must be true or false, got %s'):format(where, tostring(opts.error_term)), 2)
  end
  local error_term = opts.error_term == true
  local locs = M.locations(model, c, where, 2)
  local outputs = {}
  for i, loc in ipairs(locs) do outputs[i] = loc.output end
  splice.refuse_stacked(model, outputs, where, 2)
  local D = c.cfg.d_model
  local state = {x = {}, f0 = {}, f = {}}  -- this forward's inputs, features (as computed and as published), layer by layer
  local handles = {}
  local function take_input(l, x)
    if x:size(-1) ~= D then
      error(("%s: the input of layer %d at '%s' is %d wide; the transcoders' d_model is %d"):format(where, l, locs[l].input,
        x:size(-1), D), 0)
    end
    if l == 1 then state.x, state.f0, state.f, state.changed = {}, {}, {}, false end
    state.x[l] = x:to(c.W_enc.dtype)
  end
  for m, loc in ipairs(locs) do
    local owner, _, hook = points.locate(model, loc.output, 1)
    local prefix = hook and (hook .. '.') or ''
    local acts_name, error_name = loc.output .. '.clt.acts', loc.output .. '.clt.error'
    local function splice_in(t)
      if not state.x[m] or (m > 1 and not state.f[m - 1]) then
        error(("%s: layer %d's output came before its input and the earlier layers' in this forward"):format(where, m), 0)
      end
      local x = state.x[m]
      local f = c:encode_layer(x, m)
      local published = hooks.publish(owner, acts_name, f)
      state.f0[m], state.f[m] = f, published:to(c.W_enc.dtype)
      state.changed = state.changed or not rawequal(published, f)  -- this layer's features or an earlier one's
      local recon = c:decode_layer(state.f0, m, x):to(t.dtype)
      local raw_err = t - recon
      local err = hooks.publish(owner, error_name, raw_err)
      local out = state.changed and c:decode_layer(state.f, m, x):to(t.dtype) or recon
      if not error_term then return out end
      if not state.changed and rawequal(err, raw_err) then
        if not torch.is_grad_enabled() then return t end
        return t + (recon - recon:detach())  -- t's value exactly; the gradient reaches the features
      end
      return out + err
    end
    if loc.from_module_input and loc.input == loc.output then
      handles[#handles + 1] = hooks.replace(model, loc.output, function(t, _, input)
        take_input(m, input)
        return splice_in(t)
      end)
    else
      handles[#handles + 1] = hooks.replace(model, loc.input, function(t, _, input)
        take_input(m, loc.from_module_input and input or t)
      end)
      handles[#handles + 1] = hooks.replace(model, loc.output, function(t) return splice_in(t) end)
    end
    local entry = handles[#handles].attached[1][2]
    entry.publishes = {prefix .. 'clt.acts', prefix .. 'clt.error'}
    entry.sae = c
  end
  return hooks.group(handles)
end

return M
