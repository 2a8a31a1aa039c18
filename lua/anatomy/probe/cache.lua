-- probe.run_with_cache and its cache: every activation one forward
-- published, by name (module outputs and hook points), with the ids and each
-- token's text. cache['blocks.1.attn.pattern'] is a tensor; the methods below
-- read across layers and heads.
local torch = require('anatomy.torch')
local points = require('anatomy.probe.points')
local nn = require('anatomy.nn')
local hooks = require('anatomy.probe.hooks')
local inputs = require('anatomy.probe.inputs')
local options = require('anatomy.torch.options')
local figure = require('anatomy.render.figure')
local format = require('anatomy.render.format')
local Cache = {}

local methods = {}
Cache.__typename = 'probe.Cache'
Cache.methods = methods  -- what help(cache) lists
-- cache[name]: the tensor published at name, in anatomy's spelling,
-- TransformerLens's (cache['blocks.0.attn.hook_z'], layers from 0) or, for
-- a model from models.from_pretrained, the checkpoint's
-- (cache['transformer.h.0.attn.z'] is cache['h.1.attn.z']). A name that is
-- no point of the model is an error naming the closest, and so is a point
-- the run did not record (the filter left it out), as a TransformerLens
-- cache raises; cache:get(name) is nil for that one instead.
local fields = {mask = true}  -- fields a cache may lack (nil without padding)

-- The tensor at key in any spelling, or nil and anatomy's name of it when
-- the model has that point but the run did not record it; an error at
-- `level` when the model has no such point.
local function lookup(self, key, level)
  local tensors = rawget(self, '_tensors')
  local t = tensors[key]
  if t ~= nil then return t end
  local model = rawget(self, '_model')
  local ok, name = pcall(points.canonical, model, key)
  if not ok then error(('probe cache: %s'):format(tostring(name):gsub('^[^:]*:%d+: ', '')), level + 1) end
  if name == nil then error(('probe cache: %s'):format(points.missing(model, key, 'the key')), level + 1) end
  return tensors[name], name
end

Cache.__index = function(self, key)
  local m = methods[key]
  if m ~= nil then return m end
  if type(key) ~= 'string' or fields[key] then return nil end
  local t, name = lookup(self, key, 2)
  if t == nil then
    error(("probe cache: '%s'%s is a point of the model the run did not record (run_with_cache's filter left it out; "
      .. "cache:get(name) is nil for it)"):format(key, name ~= key and (' (' .. name .. ')') or ''), 2)
  end
  return t
end

-- cache:get(name) -> the tensor at name in any spelling, nil when the run did
-- not record that point; a name that is no point of the model is an error.
function methods:get(name)
  if type(name) ~= 'string' then error(('cache:get: name must be a string, got %s'):format(type(name)), 2) end
  return (lookup(self, name, 2))
end

-- probe.Cache.new(model, capture, order, ids, tok) -> a cache over what hooks.attach_capture recorded
-- (capture, in the order `order`) for the input ids; run_with_cache makes it
function Cache.new(model, capture, order, ids, tok)
  -- the cache's own table, and the capture emptied: a copy of the capture
  -- table that outlives its frame in a stale stack slot (LuaJIT does not
  -- clear the slots a returned call leaves, and its collector marks them
  -- while a later call's frame covers them) keeps nothing alive once the
  -- cache is dropped
  local tensors = {}
  local grads = capture.grads
  for name, t in pairs(capture) do
    if name ~= 'grads' then tensors[name] = t end
    capture[name] = nil
  end
  local self = setmetatable({_tensors = tensors, _order = order, _model = model, ids = ids, grads = grads,
    tokens = inputs.token_texts(ids, tok), positions = {}}, Cache)
  for t = 1, ids:dim() >= 2 and ids:size(2) or 0 do self.positions[t] = t end
  return self
end

-- cache:names() -> the names held, in the order the forward published them
function methods:names()
  local out = {}
  for i, n in ipairs(self._order) do out[i] = n end
  return out
end

local element_bytes = {float64 = 8, int64 = 8, float32 = 4, int32 = 4, float16 = 2, bfloat16 = 2, int16 = 2, int8 = 1,
  uint8 = 1, bool = 1}

-- cache:memory() -> bytes held by all its tensors
function methods:memory()
  local bytes = 0
  for _, n in ipairs(self._order) do
    local t = self._tensors[n]
    if t then bytes = bytes + t:numel() * (element_bytes[t.dtype] or 4) end
  end
  return bytes
end

-- The layers' names (model:layers()), or an error saying why there are none.
local function layer_names(self, where)
  local layers, why = self._model:layers()
  if not layers then error(('%s: %s'):format(where, why), 3) end
  local names = {}
  for i, l in ipairs(layers) do names[i] = l[1] end
  return names
end

-- The cached name for `point` in layer `layer`: '<layer>.<point>', or the one
-- name below the layer that ends in '.<point>' ('pattern' finds
-- 'blocks.2.attn.pattern'; 'attn.z' finds 'blocks.2.attn.z').
local function in_layer(self, layer, point, where)
  local exact = layer .. '.' .. point
  if self._tensors[exact] ~= nil then return exact end
  local found = {}
  for _, n in ipairs(self._order) do
    if n:sub(1, #layer + 1) == layer .. '.' and n:sub(-#point - 1) == '.' .. point then found[#found + 1] = n end
  end
  if #found == 1 then return found[1] end
  if #found == 0 then
    error(("%s: the cache has no '%s' in layer %s (run_with_cache's filter left it out, or the layer does not publish it)"):format(
      where, point, layer), 3)
  end
  error(("%s: '%s' is ambiguous in layer %s: %s"):format(where, point, layer, table.concat(found, ', ')), 3)
end

-- cache:stack(point) -> (L, ...): point ('resid_post', 'pattern', 'mlp.post')
-- in every layer of model:layers(), stacked.
function methods:stack(point)
  local where = 'cache:stack'
  if type(point) ~= 'string' then error(('%s: point must be a string, got %s'):format(where, type(point)), 2) end
  local list = {}
  for i, layer in ipairs(layer_names(self, where)) do list[i] = self._tensors[in_layer(self, layer, point, where)] end
  return torch.stack(list, 1)
end

local function layer_name(self, layer, where)
  local names = layer_names(self, where)
  if type(layer) == 'number' then
    if layer % 1 ~= 0 or layer < 1 or layer > #names then
      error(('%s: layer must be in 1..%d, got %s'):format(where, #names, tostring(layer)), 3)
    end
    return names[layer]
  end
  local resolved = points.resolve_name(self._model, layer, 3)  -- the checkpoint's spelling too
  for _, n in ipairs(names) do if n == resolved then return n end end
  error(("%s: no layer '%s' (layers: %s)"):format(where, tostring(layer), table.concat(names, ', ')), 3)
end

-- What TransformerLens users reach for first, with anatomy's layer numbers
-- (from 1) and TransformerLens's meanings. Each names the points it reads
-- directly (points.resid, points.part, points.embedding: probe/roles.lua),
-- so it works for every model whose blocks declare their roles; a point the
-- run did not record is an error that says which (and TransformerLens's name
-- of it). resolve(model, ...) gives the name, or raises why there is none.
local function need(self, where, resolve, ...)
  local ok, name = pcall(resolve, self._model, ...)
  if not ok then error(('%s: %s'):format(where, (tostring(name):gsub('^[^:]*:%d+: ', ''))), 3) end
  local t = self._tensors[name]
  if t == nil then
    local tl_name = points.to_transformer_lens(self._model, name)
    error(("%s: the cache has no '%s'%s: run probe.run_with_cache without a filter, or with it in the filter"):format(
      where, name, tl_name and (' (' .. tl_name .. ')') or ''), 3)
  end
  return t
end

-- Resolvers of points the methods read besides points.resid and points.part.
local function embedding(model, which)
  local name, why = points.embedding(model, which)
  if not name then error(why, 0) end
  return name
end
local function head_results(model, layer) return points.part(model, layer, 'attn') .. '.result' end

-- The norm before `layer` (L + 1: the final norm): its name, or an error saying why there is none.
local function norm_before(model, layer, L, mlp_input)
  if layer <= L then return points.part(model, layer, mlp_input and 'ln2' or 'ln1') end
  local name, why = points.final_norm(model)
  if not name then error(why, 0) end
  return name
end
local function norm_scale(model, layer, L, mlp_input) return norm_before(model, layer, L, mlp_input) .. '.scale' end

local function layer_count(self, where)
  local layers, why = self._model:layers()
  if not layers then error(('%s: %s'):format(where, why), 3) end
  return #layers
end

-- The layer argument of the methods below: nil (the stream before the
-- final norm, after every layer) or 1..L+1 (the input of that layer; L + 1
-- is the final norm's input too).
local function upto(self, layer, where, level)
  local L = layer_count(self, where)
  if layer == nil then return L + 1, L end
  if type(layer) ~= 'number' or layer % 1 ~= 0 or layer < 1 or layer > L + 1 then
    error(('%s: layer must be in 1..%d (the input of that layer; %d or nil: the final norm\'s), got %s'):format(
      where, L + 1, L + 1, tostring(layer)), level or 3)
  end
  return layer, L
end

-- A decomposition method's options (checked against keys), its layer and L (upto).
local function opening(self, opts, keys, where)
  opts = options.check(opts, keys, where, 3)
  return opts, upto(self, opts.layer, where, 4)
end

-- The stack (N, B, T, C) of a decomposition's parts ({tensor, label}, ...)
-- and their labels; with opts.apply_ln as the norm before `layer` sees them
-- (recompute: the final norm itself).
local function stacked(self, parts, opts, layer, recompute)
  local list, labels = {}, {}
  for i, p in ipairs(parts) do list[i], labels[i] = p[1], p[2] end
  local stack = torch.stack(list, 1)
  if opts.apply_ln then
    stack = self:apply_ln_to_stack(stack, {layer = layer, mlp_input = opts.mlp_input, recompute = recompute})
  end
  return stack, labels
end

-- cache:apply_ln_to_stack(stack, {layer, mlp_input = false, recompute = false})
-- -> stack (N, B, T, C) as the norm before `layer` sees it: centred (a
-- LayerNorm; not an RMSNorm) and divided by that norm's scale cached in this
-- run (layer's first norm, its second with mlp_input; the final norm for
-- nil), so each component's share of the normalized input adds up; with
-- recompute, the final norm itself (its weight and bias, its statistics from
-- each component), as TransformerLens's logit lens. Layers count from 1.
function methods:apply_ln_to_stack(stack, opts)
  local where = 'cache:apply_ln_to_stack'
  opts = options.check(opts, {'layer', 'mlp_input', 'recompute'}, where, 2)
  if not torch.is_tensor(stack) or stack:dim() < 2 then
    error(('%s: stack must be a tensor (N, ..., C), got %s'):format(where, torch.is_tensor(stack) and format.shape(stack) or type(stack)), 2)
  end
  local layer, L = upto(self, opts.layer, where)
  local final = layer == L + 1
  if opts.mlp_input and final then error(('%s: mlp_input names a layer\'s second norm; the final norm has none'):format(where), 2) end
  local ok, norm_name = pcall(norm_before, self._model, layer, L, opts.mlp_input)
  if not ok then error(('%s: %s'):format(where, (tostring(norm_name):gsub('^[^:]*:%d+: ', ''))), 2) end
  local norm = points.module(self._model, norm_name)
  if opts.recompute then
    if not final then error(('%s: recompute applies the final norm; give no layer (or %d)'):format(where, L + 1), 2) end
    local out = {}
    torch.no_grad(function() for i = 1, stack:size(1) do out[i] = norm(stack[i]) end end)
    return torch.stack(out, 1)
  end
  if nn.typename(norm) == 'nn.LayerNorm' then stack = stack - stack:mean(-1, true) end
  return stack / need(self, where, norm_scale, layer, L, opts.mlp_input)
end

-- cache:accumulated_resid({layer, incl_mid = false, mlp_input = false,
-- apply_ln = false}) -> stack (N, B, T, C), labels: the residual stream as
-- each layer before `layer` reads it (resid_pre; with incl_mid each
-- resid_mid too; with mlp_input also `layer`'s resid_mid), and with no
-- layer the final one after the last layer ('final_post'). apply_ln: the
-- final norm recomputed on each (no layer, the logit lens), or `layer`'s
-- norm with this run's scale. Labels: '1_pre', '1_mid', ..., 'final_post'.
function methods:accumulated_resid(opts)
  local where, parts = 'cache:accumulated_resid', {}
  local o, layer, L = opening(self, opts, {'layer', 'incl_mid', 'mlp_input', 'apply_ln'}, where)
  for l = 1, layer do
    if l == L + 1 then
      parts[#parts + 1] = {need(self, where, points.resid, L, 'post'), 'final_post'}
    else
      parts[#parts + 1] = {need(self, where, points.resid, l, 'pre'), l .. '_pre'}
      if (o.incl_mid and l < layer) or (o.mlp_input and l == layer) then
        parts[#parts + 1] = {need(self, where, points.resid, l, 'mid'), l .. '_mid'}
      end
    end
  end
  return stacked(self, parts, o, layer, layer == L + 1)
end

-- cache:decompose_resid({layer, mlp_input = false, apply_ln = false,
-- incl_embeds = true}) -> stack (N, B, T, C), labels: the residual stream
-- before `layer` (nil: after every layer) as the sum of its parts: the token
-- embedding ('embed'), the position embedding where the model adds one
-- ('pos_embed'), and each earlier layer's attention and MLP outputs
-- ('1_attn_out', '1_mlp_out', ...; with mlp_input also `layer`'s attention).
-- apply_ln: divided by `layer`'s norm scale (the final norm's for nil).
function methods:decompose_resid(opts)
  local where, parts = 'cache:decompose_resid', {}
  local o, layer, L = opening(self, opts, {'layer', 'mlp_input', 'apply_ln', 'incl_embeds'}, where)
  if o.incl_embeds ~= false then
    parts[1] = {need(self, where, embedding, 'tokens'), 'embed'}
    local pos = points.embedding(self._model, 'positions')
    if pos and self._tensors[pos] ~= nil then parts[2] = {self._tensors[pos], 'pos_embed'} end
  end
  for l = 1, layer - 1 do
    parts[#parts + 1] = {need(self, where, points.output, l, 'attn'), l .. '_attn_out'}
    parts[#parts + 1] = {need(self, where, points.output, l, 'mlp'), l .. '_mlp_out'}
  end
  if o.mlp_input then
    if layer == L + 1 then error(('%s: mlp_input names a layer; the final norm has no MLP before it'):format(where), 2) end
    parts[#parts + 1] = {need(self, where, points.output, layer, 'attn'), layer .. '_attn_out'}
  end
  return stacked(self, parts, o, layer)
end

-- cache:stack_head_results({layer, apply_ln = false}) -> stack (N, B, T, C),
-- labels: each head's output written to the residual stream (its z through
-- its part of the output projection; the cache's `result`, which
-- run_with_cache records with '*.result' in its filter), for every head of
-- the layers before `layer` (nil: all), in order; labels 'L1H1', 'L1H2', ...
-- The attention's output bias is in no head. apply_ln as decompose_resid.
function methods:stack_head_results(opts)
  local where, parts = 'cache:stack_head_results', {}
  local o, layer = opening(self, opts, {'layer', 'apply_ln'}, where)
  for l = 1, layer - 1 do
    local r = need(self, where, head_results, l)  -- (B, T, H, C)
    for h = 1, r:size(3) do parts[#parts + 1] = {r:select(3, h), ('L%dH%d'):format(l, h)} end
  end
  if #parts == 0 then error(('%s: no layer before layer %d'):format(where, layer), 2) end
  return stacked(self, parts, o, layer)
end

-- cache:heads(point, layer) -> point in that layer (its number or name) with
-- the head dimension first: pattern (B, H, T, T) -> (H, B, T, T), z
-- (B, T, H, D) -> (H, B, T, D).
function methods:heads(point, layer)
  local where = 'cache:heads'
  local name = in_layer(self, layer_name(self, layer, where), point, where)
  local t = self._tensors[name]
  local d = points.layout(self._model, name).head
  if not d then error(("%s: '%s' has no head dimension"):format(where, name), 2) end
  local order = {d}
  for i = 1, t:dim() do if i ~= d then order[#order + 1] = i end end
  return t:permute(unpack(order))
end

-- cache:attention(layer, head, {batch = 1, numbers = false}) -> a figure:
-- that head's pattern, query tokens down, key tokens across, shaded by
-- weight; it prints as text (numbers = true prints the weights) and shows in
-- a notebook as a heatmap (fig:svg(), fig:save(path)).
function methods:attention(layer, head, opts)
  local where = 'cache:attention'
  opts = options.check(opts, {'batch', 'numbers'}, where, 2)
  local p = self:heads('pattern', layer)
  local H, B = p:size(1), p:size(2)
  if type(head) ~= 'number' or head % 1 ~= 0 or head < 1 or head > H then
    error(('%s: head must be in 1..%d, got %s'):format(where, H, tostring(head)), 2)
  end
  local b = opts.batch or 1
  if type(b) ~= 'number' or b % 1 ~= 0 or b < 1 or b > B then error(('%s: batch must be in 1..%d, got %s'):format(where, B, tostring(b)), 2) end
  local title = ('%s head %d%s'):format(layer_name(self, layer, where), head, B > 1 and (', sequence ' .. b) or '')
  return figure.attention(title, self.tokens[b], p[head][b]:float(), opts.numbers)
end

function Cache.__tostring(self)
  local lines = {('probe cache: %d activations, %.1f MiB, input %s'):format(#self._order, self:memory() / 2^20,
    format.shape(self.ids))}
  for i, n in ipairs(self._order) do
    if i > 40 then
      lines[#lines + 1] = ('  ... and %d more (cache:names())'):format(#self._order - 40)
      break
    end
    lines[#lines + 1] = ('  %-40s %s'):format(n, format.shape(self._tensors[n]))
  end
  return table.concat(lines, '\n')
end

-- probe.run_with_cache(model, input, {filter, grad = false, tokenizer}) ->
-- output, cache. input: ids or text (probe.to_ids). cache[name] is every
-- module output and hook point the filter matches (all of them without one),
-- detached unless grad (with grad = true, cache.grads[name] is each one's
-- gradient once a backward from the output has run, as TransformerLens's
-- incl_bwd); a built-in attention's per-head 'result' (B, T, H, C)
-- only where the filter names it ('h.1.attn.result', or {'*', '*.result'}
-- for everything with it), as TransformerLens's use_attn_result; cache.ids, cache.tokens[b][t] (each token's text),
-- cache:stack('resid_post') (L, ...), cache:heads('pattern', layer),
-- cache:memory(), cache:attention(layer, head) (lua/anatomy/probe/cache.lua).
-- Examples of different lengths (a list of texts or of 1-D ids) are padded
-- on padding_side ('right' or 'left') and run with a padding mask (or give
-- ids with attention_mask (B, T), true or 1 at real tokens): no real
-- position reads a padded one, positions count real tokens, and cache.mask
-- says which positions are real (nil without padding).
function Cache.run_with_cache(model, input, opts)
  local where = 'probe.run_with_cache'
  opts = options.check(opts, {'filter', 'grad', 'tokenizer', 'padding_side', 'attention_mask'}, where, 2)
  local ids, tok, mask = inputs.to_ids(model, input, opts.tokenizer, where, opts.padding_side)
  if opts.attention_mask ~= nil then
    if mask then error(('%s: attention_mask is for ids; the input was padded here already'):format(where), 2) end
    mask = inputs.check_mask(ids, opts.attention_mask, where)
  end
  local capture, handle, order, groups = hooks.attach_capture(model, {filter = opts.filter, grad = opts.grad, strict = true,
    where = where, level = 2})
  local ok, out = pcall(function()
    if opts.grad then return inputs.forward(model, ids, mask, where) end
    return torch.no_grad(function() return inputs.forward(model, ids, mask, where) end)
  end)
  handle:remove()
  if not ok then error(out, 0) end
  points.check_hits(model, groups, order, where, 2)
  local cache = Cache.new(model, capture, order, ids, tok)
  rawset(cache, 'mask', mask)
  return out, cache
end

-- probe.run_with_hooks(model, input, fwd_hooks, {tokenizer, padding_side,
-- attention_mask}) -> output: one forward with fwd_hooks attached, removed
-- again when it returns or raises, as TransformerLens's run_with_hooks.
-- fwd_hooks: {{name, fn}, ...}; name a point in any spelling
-- ('blocks.0.attn.hook_z', 'blocks.1.attn.z') or a glob of them
-- ('blocks.*.hook_resid_post'); fn(activation, name) returns the
-- activation to use instead, or nil to keep it (probe.replace's rule).
-- The gradient flows as in any forward.
function Cache.run_with_hooks(model, input, fwd_hooks, opts)
  local where = 'probe.run_with_hooks'
  opts = options.check(opts, {'tokenizer', 'padding_side', 'attention_mask'}, where, 2)
  if type(fwd_hooks) ~= 'table' then
    error(('%s: fwd_hooks must be a list of {name, fn}, got %s'):format(where, type(fwd_hooks)), 2)
  end
  local wanted = {}
  for i, h in ipairs(fwd_hooks) do
    if type(h) ~= 'table' or type(h[1]) ~= 'string' or type(h[2]) ~= 'function' then
      error(('%s: fwd_hooks[%d] must be {name, fn(activation, name)}, got %s'):format(where, i,
        type(h) == 'table' and ('{%s, %s}'):format(type(h[1]), type(h[2])) or type(h)), 2)
    end
    local names
    if h[1]:find('*', 1, true) then
      local translated = points.expand_filter(model, h[1], where, 2, true)
      names = {}
      local match = points.matcher(translated)
      for _, n in ipairs(points.names(model)) do if match(n) then names[#names + 1] = n end end
      if #names == 0 then error(('%s: %s'):format(where, points.missing(model, h[1], 'the name')), 2) end
    else
      local name, why = points.canonical(model, h[1])
      if not name then error(('%s: %s'):format(where, points.missing(model, h[1], 'the name')), 2) end
      names = {name}
    end
    for _, n in ipairs(names) do wanted[#wanted + 1] = {n, h[2]} end
  end
  local ids, _, mask = inputs.to_ids(model, input, opts.tokenizer, where, opts.padding_side)
  if opts.attention_mask ~= nil then
    if mask then error(('%s: attention_mask is for ids; the input was padded here already'):format(where), 2) end
    mask = inputs.check_mask(ids, opts.attention_mask, where)
  end
  local handles = {}
  for _, w in ipairs(wanted) do handles[#handles + 1] = hooks.replace(model, w[1], w[2]) end
  return hooks.with(handles, function() return inputs.forward(model, ids, mask, where) end)
end

return Cache
