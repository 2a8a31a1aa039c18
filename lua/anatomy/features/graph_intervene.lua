-- sae.intervene(model, transcoders, ids, interventions, opts): set
-- transcoder features to values and rerun the model, as circuit-tracer
-- 0.5.0's ReplacementModel.feature_intervention computes it; g:ablate and
-- g:steer on a sae.Graph (docs/graphs.md, Interventions). The transcoders
-- run beside the real MLPs, so with no intervention the logits are the
-- model's own; setting feature f of layer l at position p to v adds
-- (v − a) · W_dec_l[f] to the MLP outputs it decodes to (a CLT's every
-- later layer), a its activation in this run (the clean run's where
-- constrained_layers is given). Options:
--   freeze_attention (true)    every attention pattern held at its clean value
--   constrained_layers (none)  a list of layers whose MLP outputs are held at
--                              their clean values (a skip's part follows its
--                              input), the only layers the writes reach; all
--                              of them holds every norm's divisor too: the
--                              direct effects the graph's edges measure
--   apply_activation_function (true)  the activations returned are the
--                              features, else their pre-activations
-- The first position's activations are zero, as circuit-tracer's
-- (its BOS): there a = 0.
-- L layers, T positions, D the model's width, F features a layer, V vocabulary.
local torch = require('anatomy.torch')
local options = require('anatomy.torch.options')
local points = require('anatomy.probe.points')
local hooks = require('anatomy.probe.hooks')
local probe = require('anatomy.probe')
local nn = require('anatomy.nn')
local splice = require('anatomy.features.clt_splice')

local M = {}

local OPTS = {'constrained_layers', 'freeze_attention', 'apply_activation_function'}

local function whole_in(v, lo, hi)
  return type(v) == 'number' and v == v and v % 1 == 0 and v >= lo and v <= hi
end

-- ids: a LongTensor (T) or (1, T), or a table of ids (anatomy's, from 1);
-- sae.intervene has tokenized a text already, as sae.attribute does
local function check_ids(model, ids, where, level)
  if type(ids) == 'table' and not torch.is_tensor(ids) then
    if #ids == 0 then error(where .. ': ids must not be empty', level) end
    ids = torch.tensor(ids):long()
  end
  if not torch.is_tensor(ids) then
    error(('%s: ids must be a LongTensor (T) or (1, T) or a table of ids, got %s'):format(where, type(ids)), level)
  end
  if ids:dim() == 2 and ids:size(1) == 1 then ids = ids:squeeze(1) end
  if ids:dim() ~= 1 or ids:size(1) < 1 or ids:is_floating_point() then
    error(('%s: ids must be one prompt of integer ids, (T) or (1, T), got %s (%s)'):format(where, table.concat(ids:size(), ', '),
      tostring(ids.dtype)), level)
  end
  local V = model:unembedding():size(1)
  local lo, hi = ids:min():item(), ids:max():item()
  if lo < 1 or hi > V then error(('%s: ids must lie in 1..%d (the vocabulary), got %d..%d'):format(where, V, lo, hi), level) end
  return ids:long():to(model:device())
end

local function check_opts(opts, L, where, level)
  opts = options.check(opts, OPTS, where, level)
  local o = {freeze_attention = true, apply_activation_function = true}
  for _, k in ipairs{'freeze_attention', 'apply_activation_function'} do
    if opts[k] ~= nil and type(opts[k]) ~= 'boolean' then
      error(('%s: %s must be true or false, got %s'):format(where, k, tostring(opts[k])), level)
    end
    if opts[k] ~= nil then o[k] = opts[k] end
  end
  local cl = opts.constrained_layers
  if cl ~= nil then
    if type(cl) ~= 'table' or torch.is_tensor(cl) or #cl == 0 then
      error(('%s: constrained_layers must be a non-empty list of layers in 1..%d, got %s'):format(where, L, tostring(cl)), level)
    end
    o.constrained = {}
    for i, l in ipairs(cl) do
      if not whole_in(l, 1, L) then
        error(('%s: constrained_layers[%d] must be a layer in 1..%d, got %s'):format(where, i, L, tostring(l)), level)
      end
      o.constrained[l] = true
    end
    o.n_constrained = 0
    for _ in pairs(o.constrained) do o.n_constrained = o.n_constrained + 1 end
  end
  return o
end

-- interventions: {{layer, pos, feature, value}, ...}, each positional or
-- named; pos a position, or a list / 1-D LongTensor of them with value a
-- number or a tensor over them. Returns by layer: {{pos = {..}, feature,
-- values = {..}}, ...}
local function check_interventions(list, L, T, F, where, level)
  if type(list) ~= 'table' or torch.is_tensor(list) then
    error(('%s: interventions must be a list of {layer, pos, feature, value}, got %s'):format(where, type(list)), level)
  end
  local by_layer, n = {}, 0
  for i, e in ipairs(list) do
    local at = ('%s: interventions[%d]'):format(where, i)
    if type(e) ~= 'table' then error(('%s must be {layer, pos, feature, value}, got %s'):format(at, type(e)), level) end
    for k in pairs(e) do
      if not (k == 1 or k == 2 or k == 3 or k == 4 or k == 'layer' or k == 'pos' or k == 'feature' or k == 'value') then
        local near = type(k) == 'string' and options.closest(k, {'layer', 'pos', 'feature', 'value'})
        error(("%s: unknown key '%s' (expected layer, pos, feature, value%s)"):format(at, tostring(k),
          near and (", did you mean '%s'?"):format(near) or ''), level)
      end
    end
    local layer, pos, feature, value = e.layer or e[1], e.pos or e[2], e.feature or e[3], e.value
    if value == nil then value = e[4] end
    if not whole_in(layer, 1, L) then error(('%s: layer must be in 1..%d, got %s'):format(at, L, tostring(layer)), level) end
    if not whole_in(feature, 1, F) then error(('%s: feature must be in 1..%d, got %s'):format(at, F, tostring(feature)), level) end
    local ps = pos
    if torch.is_tensor(ps) then
      if ps:dim() ~= 1 or ps:is_floating_point() then error(('%s: pos must be a 1-D LongTensor of positions'):format(at), level) end
      ps = ps:tolist()
    elseif type(ps) ~= 'table' then ps = {ps} end
    if #ps == 0 then error(('%s: pos must name at least one position'):format(at), level) end
    for j, p in ipairs(ps) do
      if not whole_in(p, 1, T) then error(('%s: pos%s must be in 1..%d (the prompt), got %s'):format(at, #ps > 1 and ('[' .. j .. ']') or '', T, tostring(p)), level) end
    end
    local vs
    if torch.is_tensor(value) then
      if value:numel() ~= #ps then
        error(('%s: value has %d entries, the positions %d'):format(at, value:numel(), #ps), level)
      end
      vs = value:double():reshape({-1}):tolist()
    elseif type(value) == 'number' then
      vs = {}
      for j = 1, #ps do vs[j] = value end
    else
      error(('%s: value must be a number or a tensor over the positions, got %s'):format(at, type(value)), level)
    end
    for j, v in ipairs(vs) do
      if v ~= v or v == math.huge or v == -math.huge then
        error(('%s: value%s must be finite, got %s'):format(at, #vs > 1 and ('[' .. j .. ']') or '', tostring(v)), level)
      end
    end
    by_layer[layer] = by_layer[layer] or {}
    table.insert(by_layer[layer], {pos = ps, feature = feature, values = vs})
    n = n + 1
  end
  return by_layer, n
end

-- The points held at their clean values: every attention pattern, and with
-- scales every norm's divisor (ln1, ln2, post-norms, the final norm)
local function frozen_points(model, L, scales, where)
  local names = {}
  for l = 1, L do
    names[#names + 1] = points.part(model, l, 'attn', 4) .. '.pattern'
    if scales then
      for _, role in ipairs{'ln1', 'ln2', 'ln1_post', 'ln2_post'} do
        local ok, name = pcall(points.part, model, l, role, 1)
        if ok then names[#names + 1] = name .. '.scale' end
      end
    end
  end
  if scales then
    local final, why = points.final_norm(model)
    if not final then error(('%s: %s'):format(where, why), 4) end
    names[#names + 1] = final .. '.scale'
  end
  return names
end

-- One forward with the handles that fill `state`: each layer's MLP input
-- (state.x[l], (B, T, D)), then on_output(l, t, x) at its output (what it
-- returns replaces t); extra handles besides. Returns the logits.
local function run(model, locs, ids, on_output, extra)
  local state = {x = {}}
  local hs = {}
  for _, h in ipairs(extra) do hs[#hs + 1] = h end
  for l, loc in ipairs(locs) do
    local same = loc.from_module_input and loc.input == loc.output
    if not same then
      hs[#hs + 1] = hooks.replace(model, loc.input, function(t, _, input)
        state.x[l] = loc.from_module_input and input or t
      end)
    end
    hs[#hs + 1] = hooks.replace(model, loc.output, function(t, _, input)
      if same then state.x[l] = input end
      return on_output(l, t, state.x[l])
    end)
  end
  return hooks.with(hooks.group(hs), function() return model(ids:view(1, -1)) end)
end

-- Layer l's features (T, F) of its MLP input x (1, T, D), the first
-- position's zero; pre: before the activation function
local function features(c, x, l, pre)
  local f
  if pre then
    f = x[1]:to(c.W_enc.dtype):matmul(c.W_enc:select(1, l):t()) + c.b_enc:select(1, l)
  else
    f = c:encode_layer(x[1], l)
  end
  f = f:clone()
  f[1]:zero_()
  return f
end

-- The rerun, for sae.intervene and the graph's methods; errors at `level` (the user's line)
local function intervene(model, c, ids, interventions, opts, where, level)
  if type(model) ~= 'table' or type(model.unembedding) ~= 'function' then
    error(where .. ': model must be a language model (one with model:unembedding())', level)
  end
  if nn.typename(c) ~= 'sae.CLT' then
    error(('%s: transcoders must be a sae.CLT (sae.clt, sae.load_clt), got %s'):format(where, nn.typename(c) or type(c)), level)
  end
  ids = check_ids(model, ids, where, level + 1)
  local L, T, F = c.cfg.n_layers, ids:size(1), c.cfg.d_transcoder
  local by_layer, n = check_interventions(interventions, L, T, F, where, level + 1)
  local o = check_opts(opts, L, where, level + 1)
  hooks.require_clean(model, where, level)  -- an ablation left attached would be rerun as the model
  local locs = splice.locations(model, c, where, level)
  local dtype = c.W_enc.dtype
  local function skip(l, x) return x[1]:to(dtype):matmul(c.W_skip:select(1, l):t()) end
  return probe.scope(model, function()
    return torch.no_grad(function()
      -- the clean run, where something is held at its value (circuit-tracer: only with interventions)
      local clean = {held = {}, out = {}, x = {}, acts = {}}  -- copies: nothing later writes into them
      local held, froze = {}, n > 0 and (o.freeze_attention or o.constrained)
      if froze then
        local names = frozen_points(model, L, o.constrained and o.n_constrained == L, where)
        local hs = {}
        for _, name in ipairs(names) do
          hs[#hs + 1] = hooks.replace(model, name, function(t) clean.held[name] = t:clone() end)
        end
        run(model, locs, ids, function(l, t, x)
          clean.out[l], clean.x[l], clean.acts[l] = t:clone(), x:clone(), features(c, x, l, false)
        end, hs)
        for _, name in ipairs(names) do
          held[#held + 1] = hooks.replace(model, name, function() return clean.held[name] end)
        end
      end
      local acts = {}
      local deltas = torch.zeros({L, T, c.cfg.d_model}, {dtype = dtype, device = c.W_enc.device})
      local logits = run(model, locs, ids, function(l, t, x)
        local post = features(c, x, l, false)
        acts[l] = o.apply_activation_function and post or features(c, x, l, true)
        if froze and o.constrained and o.constrained[l] then
          local frozen = clean.out[l]
          if c.W_skip then frozen = frozen + (skip(l, x) - skip(l, clean.x[l])):to(frozen.dtype):view(1, T, -1) end
          t = frozen
        end
        local here = by_layer[l]
        if here then  -- what these features write, less what they wrote, to layer l and on
          local base = o.constrained and clean.acts[l] or post
          local d = torch.zeros({T, F}, {dtype = dtype, device = base.device})
          for _, e in ipairs(here) do
            for j, p in ipairs(e.pos) do d[p][e.feature] = e.values[j] - base[p][e.feature]:item() end
          end
          local W = c:decoder(l)
          for j = 1, W:size(2) do deltas[l + j - 1]:add_(d:matmul(W:select(2, j))) end
        end
        if not o.constrained or o.constrained[l] then
          t = t + deltas[l]:to(t.dtype):view(1, T, -1)
          deltas[l]:zero_()
        end
        return t
      end, held)
      return {logits = logits[1]:float(), activations = torch.stack(acts):float()}
    end)
  end, {mode = 'eval'})
end

-- sae.intervene(model, transcoders, ids, interventions, {constrained_layers, freeze_attention = true,
-- apply_activation_function = true, tokenizer}) -> {logits (T, V), activations (L, T, F)}: circuit-tracer's
-- feature_intervention(ids, interventions, ...) (the header above; every index from 1). activations: each layer's
-- features in the rerun as its MLP input gives them (an intervened feature shows what its input gives, not the value
-- set), the first position's zero.
-- ids may be a text, tokenized as sae.attribute tokenizes it (opts.tokenizer or the model's; graph_prompt.lua).
function M.intervene(model, c, ids, interventions, opts)
  if type(opts) == 'table' and opts.tokenizer ~= nil or type(ids) == 'string' then
    local tok = type(opts) == 'table' and opts.tokenizer or nil
    if type(opts) == 'table' then
      local rest = {}
      for k, v in pairs(opts) do if k ~= 'tokenizer' then rest[k] = v end end
      opts = rest
    end
    ids = require('anatomy.features.graph_prompt').ids(model, ids, tok, 'sae.intervene', 2)
  end
  local r = intervene(model, c, ids, interventions, opts, 'sae.intervene', 3)
  return r
end

-- What g:ablate and g:steer return: the rerun's logits (T, V) and
-- activations (L, T, F), and the graph's logit tokens' probabilities at the
-- last position before (the graph's) and after
local Result = {__typename = 'sae.InterventionResult'}
Result.__index = Result

function Result:__tostring()
  local tok = rawget(self.model, 'tokenizer')
  local lines = {('sae.InterventionResult(%s; logits %dx%d)'):format(self.what, self.logits:size(1), self.logits:size(2)),
    ('  %-16s %9s %9s %10s'):format('token', 'before', 'after', 'change')}
  for i = 1, self.logit_tokens:size(1) do
    local id = self.logit_tokens[i]:item()
    local name = tok and ('%d %q'):format(id, tok:decode(torch.tensor({id}, {dtype = 'int64'}))) or tostring(id)
    local b, a = self.before[i]:item(), self.after[i]:item()
    lines[#lines + 1] = ('  %-16s %9.4f %9.4f %+10.4f'):format(name, b, a, a - b)
  end
  return table.concat(lines, '\n')
end

local function result(g, r, what)
  local probs = r.logits[r.logits:size(1)]:softmax(1)
  r.logit_tokens, r.before = g.logit_tokens, g.logit_probabilities
  r.after = probs:index_select(1, g.logit_tokens:to(probs.device)):cpu()
  r.what, r.model = what, g.model
  return setmetatable(r, Result)
end

-- A feature named {layer, pos, feature} (positional or named) -> layer, pos, feature
local function named(g, e, at, allowed)
  for k in pairs(e) do
    if not allowed[k] then
      local list = {}
      for name in pairs(allowed) do if type(name) == 'string' then list[#list + 1] = name end end
      table.sort(list)
      local near = type(k) == 'string' and options.closest(k, list)
      error(("%s: unknown key '%s' (expected %s%s)"):format(at, tostring(k), table.concat(list, ', '),
        near and (", did you mean '%s'?"):format(near) or ''), 4)
    end
  end
  local layer, pos, feature = e.layer or e[1], e.pos or e[2], e.feature or e[3]
  if not whole_in(layer, 1, g.n_layers) then error(('%s: layer must be in 1..%d, got %s'):format(at, g.n_layers, tostring(layer)), 4) end
  if not whole_in(pos, 1, g.n_pos) then error(('%s: pos must be in 1..%d, got %s'):format(at, g.n_pos, tostring(pos)), 4) end
  local F = g.transcoders.cfg.d_transcoder
  if not whole_in(feature, 1, F) then error(('%s: feature must be in 1..%d, got %s'):format(at, F, tostring(feature)), 4) end
  return layer, pos, feature
end

local function list_of(x, where, what)
  if type(x) ~= 'table' or torch.is_tensor(x) or #x == 0 then
    error(('%s: %s must be a non-empty list, got %s'):format(where, what, torch.is_tensor(x) and 'a Tensor' or type(x)), 4)
  end
end

-- g:ablate(features, opts) -> result: each feature set to 0 and the model rerun (sae.intervene's opts); features: a
-- list of {layer, pos, feature} or of indices into g.active_features
function M.ablate(g, feats, opts)
  local where = 'g:ablate'
  list_of(feats, where, 'features')
  local n = g.active_features:size(1)
  local list = {}
  for i, e in ipairs(feats) do
    local at = ('%s: features[%d]'):format(where, i)
    if type(e) == 'number' then
      if not whole_in(e, 1, n) then error(('%s must index g.active_features, 1..%d, got %s'):format(at, n, tostring(e)), 3) end
      local row = g.active_features[e]
      list[i] = {row[1]:item(), row[2]:item(), row[3]:item(), 0}
    elseif type(e) == 'table' then
      local l, p, f = named(g, e, at, {[1] = true, [2] = true, [3] = true, layer = true, pos = true, feature = true})
      list[i] = {l, p, f, 0}
    else
      error(('%s must be {layer, pos, feature} or an index into g.active_features, got %s'):format(at, type(e)), 3)
    end
  end
  local r = intervene(g.model, g.transcoders, g.input_tokens, list, opts, where, 4)
  return result(g, r, ('ablate %d feature%s'):format(#list, #list == 1 and '' or 's'))
end

-- g:steer(interventions, opts) -> result: each {layer, pos, feature, value = v} set to v, or {layer, pos, feature,
-- scale = s} to s times its activation in the graph (an active feature's), and the model rerun (sae.intervene's opts)
function M.steer(g, list, opts)
  local where = 'g:steer'
  list_of(list, where, 'interventions')
  local index = {}
  for i = 1, g.active_features:size(1) do
    local row = g.active_features[i]
    index[('%d,%d,%d'):format(row[1]:item(), row[2]:item(), row[3]:item())] = i
  end
  local out = {}
  for i, e in ipairs(list) do
    local at = ('%s: interventions[%d]'):format(where, i)
    if type(e) ~= 'table' then error(('%s must be {layer, pos, feature, value = v or scale = s}, got %s'):format(at, type(e)), 3) end
    local l, p, f = named(g, e, at, {[1] = true, [2] = true, [3] = true, [4] = true, layer = true, pos = true, feature = true,
      value = true, scale = true})
    local value, scale = e.value, e.scale
    if value == nil then value = e[4] end
    if (value == nil) == (scale == nil) then error(('%s: give value or scale, one of them'):format(at), 3) end
    if scale ~= nil then
      if type(scale) ~= 'number' or scale ~= scale or math.abs(scale) == math.huge then
        error(('%s: scale must be a finite number, got %s'):format(at, tostring(scale)), 3)
      end
      local j = index[('%d,%d,%d'):format(l, p, f)]
      if not j then
        error(('%s: scale multiplies an active feature\'s activation; feature (%d, %d, %d) is not active in the graph (give a value)')
          :format(at, l, p, f), 3)
      end
      value = scale * g.activation_values[j]:item()
    end
    out[i] = {l, p, f, value}
  end
  local r = intervene(g.model, g.transcoders, g.input_tokens, out, opts, where, 4)
  return result(g, r, ('steer %d feature%s'):format(#out, #out == 1 and '' or 's'))
end

return M
