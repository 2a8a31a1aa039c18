-- The parts of a layer by what they are, as their blocks declare it
-- (Class.block_role: 'attention', 'mlp', 'norm'; nn/hook_point.lua), and
-- the direct names of a layer's points: points.resid(model, 2, 'pre') is
-- 'blocks.2.resid_pre', points.part(model, 2, 'attn') 'blocks.2.attn'. The
-- cache's methods and TransformerLens's names (probe/tl_names.lua) read them.
local nn = require('anatomy.nn')
local roles = {}

local wanted = {attn = 'attention', mlp = 'mlp', ln1 = 'norm', ln2 = 'norm', ln1_post = 'norm', ln2_post = 'norm'}
-- What each role is, as an error says it is missing.
roles.described = {attn = "attention (a child declaring block_role = 'attention')",
  mlp = "MLP (a child declaring block_role = 'mlp')", ln1 = "ln1 (a first child declaring block_role = 'norm')",
  ln2 = "ln2 (a second child declaring block_role = 'norm')",
  ln1_post = "ln1_post (a norm of the attention's output, in its block's norm_roles)",
  ln2_post = "ln2_post (a norm of the MLP's output, in its block's norm_roles)"}

-- roles.child(block, role) -> the name of the child of a layer that plays
-- role: 'attn' (its attention), 'mlp', 'ln1' or 'ln2' (its first or second
-- norm), 'ln1_post' or 'ln2_post' (a norm of the attention's or MLP's
-- output); nil when none does. A block with norms elsewhere than before
-- attention and MLP names them (Block.norm_roles = {ln1_post =
-- 'post_attention_layernorm', ...}: OLMo 2's), as TransformerLens's adapters do.
function roles.child(block, role)
  local declared = block.norm_roles
  if wanted[role] == 'norm' and (declared or role == 'ln1_post' or role == 'ln2_post') then return declared and declared[role] end
  local norms = 0
  for n, c in block:named_children() do
    local r = c.block_role
    if r == wanted[role] and r ~= 'norm' then return n end
    if r == 'norm' then
      norms = norms + 1
      if (role == 'ln1' and norms == 1) or (role == 'ln2' and norms == 2) then return n end
    end
  end
  return nil
end

-- points.layer(model, layer) -> the path and module of layer `layer`
-- (1..L, model:layers()); an error at `level` says why there is none
function roles.layer(model, layer, level)
  level = (level or 1) + 1
  local layers, why = model:layers()
  if not layers then error(why, level) end
  if type(layer) ~= 'number' or layer % 1 ~= 0 or layer < 1 or layer > #layers then
    error(('layer must be in 1..%d, got %s'):format(#layers, tostring(layer)), level)
  end
  return layers[layer][1], layers[layer][2]
end

-- points.resid(model, layer, 'pre'|'mid'|'post') -> the name of the
-- residual stream at that place of the layer ('blocks.2.resid_pre')
function roles.resid(model, layer, where, level)
  level = (level or 1) + 1
  if where ~= 'pre' and where ~= 'mid' and where ~= 'post' then
    error(("points.resid: where must be 'pre', 'mid' or 'post', got %s"):format(tostring(where)), level)
  end
  return roles.layer(model, layer, level) .. '.resid_' .. where
end

-- points.part(model, layer, 'attn'|'mlp'|'ln1'|'ln2'|'ln1_post'|'ln2_post') -> the name of the
-- layer's child in that role, whose output is the part's ('blocks.2.attn':
-- TransformerLens's attn_out); an error at `level` when the layer has none
function roles.part(model, layer, role, level)
  level = (level or 1) + 1
  if not wanted[role] then
    error(("points.part: role must be 'attn', 'mlp', 'ln1', 'ln2', 'ln1_post' or 'ln2_post', got %s"):format(tostring(role)), level)
  end
  local path, block = roles.layer(model, layer, level)
  local child = roles.child(block, role)
  if not child then error(('%s has no %s'):format(path, roles.described[role]), level) end
  return path .. '.' .. child
end

-- points.output(model, layer, 'attn'|'mlp') -> the name of what the part
-- adds to the residual stream: its post-norm's output where the block has
-- one (ln1_post, ln2_post: OLMo 2's), else the part's own; TransformerLens's
-- hook_attn_out and hook_mlp_out
function roles.output(model, layer, role, level)
  level = (level or 1) + 1
  local path, block = roles.layer(model, layer, level)
  local post = (role == 'attn' or role == 'mlp') and roles.child(block, role == 'attn' and 'ln1_post' or 'ln2_post')
  if post then return path .. '.' .. post end
  return roles.part(model, layer, role, level)
end

-- points.final_norm(model) -> the name of the model's final norm
-- (model.final_norm), or nil and why not
function roles.final_norm(model)
  local norm = rawget(model, 'final_norm') or model.final_norm
  if type(norm) ~= 'string' then return nil, 'the model names no final norm (model.final_norm)' end
  return norm
end

-- points.embedding(model, 'tokens'|'positions') -> the name of the model's
-- token or position embedding (an nn.Embedding child, in that order; a
-- model's own embed or pos_embed hook point), or nil and why not
function roles.embedding(model, which)
  -- GPT-2 adds wpe's rows itself (pos_embed); Gemma scales the token embeddings (embed)
  local own = which == 'positions' and 'pos_embed' or 'embed'
  for _, p in ipairs(model:hook_points()) do if p == own then return own end end
  local embeddings = {}
  for n, c in model:named_children() do
    if nn.typename(c) == 'nn.Embedding' then embeddings[#embeddings + 1] = n end
  end
  local want = which == 'tokens' and 1 or 2
  if not embeddings[want] or (want == 1 and #embeddings > 2) then
    return nil, want == 1 and 'the model has no token embedding child (nn.Embedding)' or
      'the model has no positional embedding child (its positions are rotary, or inside another block)'
  end
  return embeddings[want]
end

return roles
