-- tl_names: TransformerLens's hook names ('blocks.0.attn.hook_z') for any
-- model with layers, and back: which of anatomy's points each one is, and
-- every one a model has, in TransformerLens's order. probe/points.lua offers
-- them (probe.from_transformer_lens, probe.transformer_lens_names,
-- probe.to_transformer_lens) with the rest of name resolution.
local nn = require('anatomy.nn')
local options = require('anatomy.torch.options')
local roles = require('anatomy.probe.roles')
local tl = {}
local listing = false  -- inside transformer_lens_names: a miss there suggests nothing
local layer_names  -- below

-- TransformerLens's hook names, with its own 0-based layer numbers, are
-- accepted for every model with layers: 'blocks.0.attn.hook_z' is the first
-- layer's attention's z ('h.1.attn.z' on a GPT-2, 'blocks.1.self_attn.z' on a
-- Llama). A name with 'hook_' in it is TransformerLens's (no anatomy name
-- has it), so the two numberings never meet in one name.
local tl_block = {hook_resid_pre = 'resid_pre', hook_resid_mid = 'resid_mid', hook_resid_post = 'resid_post'}
local tl_attn = {hook_q = 'q', hook_k = 'k', hook_v = 'v', hook_z = 'z', hook_pattern = 'pattern', hook_attn_scores = 'scores',
  hook_result = 'result', hook_rot_q = 'rot_q', hook_rot_k = 'rot_k', hook_q_normed = 'q_normed', hook_k_normed = 'k_normed'}
local tl_mlp = {hook_pre = 'pre', hook_pre_linear = 'pre_linear', hook_post = 'post'}  -- hook_pre_linear: a gated MLP's up projection
-- An MLP that is an nn.MoE: the bridge's MoE names its input and output
-- mlp.hook_pre and hook_post ('' is the block's own output), and its router
-- (mlp.gate) gives the logits and the tokens' top-k weights and experts.
local tl_moe = {hook_pre = 'input', hook_post = '', hook_router_logits = 'router_logits', ['gate.hook_out'] = 'router_logits',
  hook_expert_weights = 'expert_weights', ['gate.hook_expert_weights'] = 'expert_weights',
  hook_expert_indices = 'expert_indices', ['gate.hook_expert_indices'] = 'expert_indices'}
local tl_norm = {hook_scale = 'scale', hook_normalized = 'normalized'}
tl.tables = {block = tl_block, attn = tl_attn, mlp = tl_mlp, moe = tl_moe, norm = tl_norm}

-- The child of a layer that plays a role (its attention, MLP, first or
-- second norm), as its block declares it (probe/roles.lua).
local role_child = roles.child
tl.role_child = role_child

-- probe.from_transformer_lens(model, name) -> anatomy's name for a
-- TransformerLens hook name, nil when name is not one; an error naming what
-- is missing when the model has no counterpart.
function tl.from_transformer_lens(model, name, level)
  level = (level or 1) + 1
  if type(name) ~= 'string' or not name:find('hook_', 1, true) then return nil end
  local function fail(why)
    if why:find('no counterpart', 1, true) and not listing then  -- a misspelt name, most often: the nearest one it could be
      local names = {}
      for _, pair in ipairs(tl.transformer_lens_names(model)) do names[#names + 1] = pair[1] end
      local near = options.closest(name, names)
      if near then why = ("%s; did you mean '%s'?"):format(why, near) end
    end
    error(("'%s' (a TransformerLens name): %s"):format(name, why), level + 1)
  end
  local i, rest = name:match('^blocks%.(%d+)%.(.+)$')
  if i then
    local layers, why = model:layers()
    if not layers then fail(why) end
    i = tonumber(i)
    if i >= #layers then fail(('TransformerLens counts layers from 0, so blocks.%d is layer %d, and the model has %d'):format(i, i + 1, #layers)) end
    local path, block = layers[i + 1][1], layers[i + 1][2]
    if tl_block[rest] then return path .. '.' .. tl_block[rest] end
    if rest == 'hook_out' then return path end  -- the bridge's wrapper of the block: its output
    if rest == 'hook_attn_out' or rest == 'hook_mlp_out' then
      local role = rest == 'hook_attn_out' and 'attn' or 'mlp'
      -- what the part adds to the stream: its post-norm's output where it has one (TransformerLens's BlockBridge)
      if not role_child(block, role) then fail(('%s has no %s'):format(path, roles.described[role])) end
      return roles.output(model, i + 1, role)
    end
    local sub, hook = rest:match('^([%w_]+)%.([%w_%.]-hook_[%w_]+)$')  -- hook: 'hook_z', or a submodule's 'gate.hook_out'
    local child = sub and role_child(block, sub)
    local moe = sub == 'mlp' and child and nn.MoE and nn.is_instance(block[child], nn.MoE)
    local map = sub == 'attn' and tl_attn or moe and tl_moe or sub == 'mlp' and tl_mlp or roles.described[sub] and sub:match('^ln') and tl_norm or nil
    if not map or not (map[hook] or hook == 'hook_out') then fail('anatomy has no counterpart of it (docs/pretrained.md lists the names it maps)') end
    if not child then fail(('%s has no %s'):format(path, roles.described[sub])) end
    if hook == 'hook_out' or map[hook] == '' then return path .. '.' .. child end  -- the bridge's wrapper: the module's output
    if hook == 'hook_q_normed' or hook == 'hook_k_normed' then
      local made = rawget(block[child], '_made_with') or {}
      if made.qk_norm ~= 'head' and made.qk_norm ~= 'proj' then fail(('%s.%s has no QK-norm (qk_norm)'):format(path, child)) end
    end
    return path .. '.' .. child .. '.' .. map[hook]
  end
  local final = name:match('^ln_final%.(hook_[%w_]+)$')
  if final then
    local norm, why = roles.final_norm(model)
    if not norm then fail(why) end
    if final == 'hook_out' then return norm end
    if not tl_norm[final] then fail('anatomy has no counterpart of it (docs/pretrained.md lists the names it maps)') end
    return norm .. '.' .. tl_norm[final]
  end
  if name == 'embed.hook_out' then name = 'hook_embed' end
  if name == 'hook_embed' or name == 'hook_pos_embed' then
    local embedding, why = roles.embedding(model, name == 'hook_embed' and 'tokens' or 'positions')
    if not embedding then fail(why) end
    return embedding
  end
  fail('anatomy has no counterpart of it (docs/pretrained.md lists the names it maps)')
end

-- The names of a layer's TransformerLens hook points, in TransformerLens's order.
local tl_layer_order = {'hook_resid_pre', 'ln1.hook_scale', 'ln1.hook_normalized', 'attn.hook_q', 'attn.hook_k',
  'attn.hook_v', 'attn.hook_q_normed', 'attn.hook_k_normed', 'attn.hook_rot_q', 'attn.hook_rot_k', 'attn.hook_attn_scores',
  'attn.hook_pattern', 'attn.hook_z', 'attn.hook_result', 'ln1_post.hook_scale', 'ln1_post.hook_normalized', 'hook_attn_out',
  'hook_resid_mid', 'ln2.hook_scale', 'ln2.hook_normalized', 'mlp.hook_pre', 'mlp.hook_pre_linear', 'mlp.hook_post',
  'mlp.hook_router_logits', 'mlp.gate.hook_out', 'mlp.hook_expert_weights', 'mlp.gate.hook_expert_weights',
  'mlp.hook_expert_indices', 'mlp.gate.hook_expert_indices', 'ln2_post.hook_scale', 'ln2_post.hook_normalized',
  'hook_mlp_out', 'hook_resid_post'}

-- probe.transformer_lens_names(model) -> {{tl, anatomy}, ...}: every
-- TransformerLens hook name the model has a point for, in TransformerLens's
-- order, with anatomy's name of it ('blocks.0.attn.hook_z', 'blocks.1.attn.z').
-- What globs of TransformerLens names ('blocks.*.hook_resid_post') match.
function tl.transformer_lens_names(model)
  if not nn.is_module(model) then
    error(('probe.transformer_lens_names: model must be a model, got %s'):format(nn.typename(model)), 2)
  end
  listing = true
  local ok, out = pcall(layer_names, model)
  listing = false
  if not ok then error(out, 0) end
  return out
end

layer_names = function(model)
  local known = {}
  for _, n in ipairs(require('anatomy.probe.points').names(model)) do known[n] = true end
  local out = {}
  local function try(name_tl)
    local ok, name = pcall(tl.from_transformer_lens, model, name_tl, 1)
    if ok and name and known[name] then out[#out + 1] = {name_tl, name} end
  end
  try('hook_embed')
  try('hook_pos_embed')
  local layers = model:layers()
  for i = 0, layers and #layers - 1 or -1 do
    for _, h in ipairs(tl_layer_order) do try(('blocks.%d.%s'):format(i, h)) end
  end
  try('ln_final.hook_scale')
  try('ln_final.hook_normalized')
  return out
end

-- probe.to_transformer_lens(model, name) -> TransformerLens's spelling of
-- anatomy's name ('blocks.1.resid_post' -> 'blocks.0.hook_resid_post'), or
-- nil where TransformerLens has no name for the point.
local function tl_spelling(model, name)
  local alias  -- an MoE's output is hook_mlp_out rather than the bridge's alias of it, mlp.hook_post
  for _, pair in ipairs(tl.transformer_lens_names(model)) do
    if pair[2] == name then
      if not (pair[1]:find('%.mlp%.hook_post$') and not name:find('%.post$')) then return pair[1] end
      alias = alias or pair[1]
    end
  end
  return alias
end
tl.to_transformer_lens = tl_spelling

return tl
