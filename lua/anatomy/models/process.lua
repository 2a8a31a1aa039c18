-- TransformerLens's weight processing, on a pretrained model's own modules:
-- the same function, written in other weights, whose parts read more simply.
--   fold_ln                 each norm's scale (and, for LayerNorm, its shift)
--                           moves into the weights that read its output: the
--                           attention's q, k, v, the MLP's input, the head;
--                           the norm keeps only its normalisation (weight 1,
--                           bias 0). Under LayerNorm the reading weights are
--                           then centred over the model dimension (the
--                           norm's input has mean zero along it anyway).
--   center_writing_weights  every weight that writes into the residual
--                           stream (the embeddings, the attention's output,
--                           the MLP's output, their biases) has its mean
--                           over the model dimension taken out: LayerNorm
--                           removes it before anything reads the stream.
--   center_unembed          the head's weight and bias have their mean over
--                           the vocabulary taken out: every logit moves by
--                           the same amount, the probabilities do not.
--   fold_value_biases       the value biases move into the attention's
--                           output bias (every pattern row sums to 1).
-- Computed in float64, written back in the parameters' dtype. A tied head is
-- untied first (the embedding and the head change differently); the head
-- gains a bias where the final norm's shift has to go somewhere, and so do
-- q, k and v where a block's norm has one (GPT-J's).
local torch = require('anatomy.torch')
local nn = require('anatomy.nn')
local options = require('anatomy.torch.options')

local process = {}

local KEYS = {'fold_ln', 'center_writing_weights', 'center_unembed', 'fold_value_biases'}

local function params_of(m)
  local out = {}
  for name, p in m:named_parameters() do out[name] = p end
  return out
end

local function set(p, value) torch.no_grad(function() p:copy_(value:to(p.dtype)) end) end
local function f64(p) return p:detach():double() end

-- The value bias of an attention (C, or kv_heads x D), or nil.
local function value_bias(attn)
  local p, made = params_of(attn), rawget(attn, '_made_with') or {}
  if nn.typename(attn) == 'nn.Attention' then
    return p['qkv.bias'] and p['qkv.bias']:narrow(1, 2 * made.dim + 1, made.dim) or nil
  end
  return p['v.bias']
end

-- A rotary attention made again with the biases `which` names ('out_bias':
-- where folded value biases go, Qwen2; 'qkv_bias': where a folded LayerNorm's
-- shift goes, GPT-J), zero, its other weights copied, in its block's place.
local function with_bias(block, part, which)
  local old = part[2]
  local made = {}
  for k, v in pairs(rawget(old, '_made_with') or {}) do made[k] = v end
  made[which] = true
  local dim, heads = made.dim, made.heads
  made.dim, made.heads = nil, nil
  local new = nn.RoPEAttention(dim, heads, made)
  local w = old:parameters()[1]
  new:to(w.dtype)
  if w.device ~= 'cpu' then new:to(w.device) end
  local own = params_of(old)
  torch.no_grad(function()
    for name, p in new:named_parameters() do
      if own[name] then p:copy_(own[name]) else p:zero_() end
    end
  end)
  block[part[1]] = new
  return new
end

-- A block's parts: {ln1, attn, ln2, mlp} by the types of its children, in
-- order. A block whose one norm feeds both (Block.shared_norm: Phi's) has ln2
-- = ln1, folded once into the readers of both.
local function parts_of(path, block, where, level)
  local out, norms = {path = path, block = block}, {}
  for name, c in block:named_children() do
    local t = nn.typename(c)
    if t == 'nn.LayerNorm' or t == 'nn.RMSNorm' then norms[#norms + 1] = {name, c}
    elseif t == 'nn.Attention' or t == 'nn.RoPEAttention' then out.attn = {name, c}
    elseif t == 'nn.MLP' or t == 'nn.SwiGLU' or t == 'nn.MoE' then out.mlp = {name, c} end
  end
  out.ln1, out.ln2 = norms[1], norms[2]
  if block.shared_norm == true and #norms == 1 then out.ln2 = out.ln1 end
  local declared, posts = block.norm_roles, 0
  if declared and not declared.ln1 and not declared.ln2 then  -- norms after the parts only (OLMo 2's): TransformerLens does not fold them either
    error(('%s: %s normalises its attention\'s and MLP\'s outputs (%s), which no weight reading the stream can take in'):format(
      where, path, table.concat({declared.ln1_post, declared.ln2_post}, ', ')), level)
  end
  if declared and declared.ln1 and declared.ln2 then  -- norms before and after each part (Gemma 2/3's): the pre-norms fold, the post-norms stay, as TransformerLens's ln1_post, ln2_post
    out.ln1, out.ln2 = {declared.ln1, block[declared.ln1]}, {declared.ln2, block[declared.ln2]}
    posts = (declared.ln1_post and 1 or 0) + (declared.ln2_post and 1 or 0)
  end
  if not (out.ln1 and out.ln2 and out.attn and out.mlp and (#norms == 2 + posts or out.ln2 == out.ln1)) then
    error(('%s: %s is not a pre-norm block of two norms (or one it declares shared), an attention and an MLP that anatomy knows how to process')
      :format(where, path), level)
  end
  return out
end

-- Whether fold_ln gives a block's attention q, k and v biases: a rotary one
-- without them under a norm with a shift (GPT-J's), which folds in there, as
-- TransformerLens's b_Q, b_K and b_V (b_V then into b_O by fold_value_biases).
local function gains_qkv_bias(b)
  return nn.typename(b.attn[2]) == 'nn.RoPEAttention' and params_of(b.ln1[2]).bias ~= nil and params_of(b.attn[2])['q.bias'] == nil
end

-- The linear maps reading a part's input: {{weight, bias or nil, name}, ...} (weights out x in); an nn.MoE's
-- are its router and each expert's gate and up (as TransformerLens's bridge folds ln2 into them)
local function readers(part)
  local m, p = part[2], params_of(part[2])
  local t = nn.typename(m)
  if t == 'nn.MoE' then
    local out = {{p['gate.weight'], p['gate.bias'], part[1] .. '.gate'}}
    for e = 1, m.num_experts do
      for _, n in ipairs({'gate', 'up'}) do
        local k = ('experts.%d.%s'):format(e, n)
        out[#out + 1] = {p[k .. '.weight'], p[k .. '.bias'], part[1] .. '.' .. k}
      end
    end
    return out
  end
  local names = t == 'nn.Attention' and {'qkv'} or t == 'nn.RoPEAttention' and {'q', 'k', 'v'} or t == 'nn.MLP' and {'fc'} or {'gate', 'up'}
  local out = {}
  for _, n in ipairs(names) do out[#out + 1] = {p[n .. '.weight'], p[n .. '.bias'], part[1] .. '.' .. n} end
  return out
end

-- The linear map writing a part's output into the stream: weight (C x in), bias or nil
local function writer(part)
  local m, p = part[2], params_of(part[2])
  local t = nn.typename(m)
  local n = t == 'nn.Attention' and 'proj' or t == 'nn.RoPEAttention' and 'o' or t == 'nn.MLP' and 'proj' or 'down'
  return p[n .. '.weight'], p[n .. '.bias'], part[1] .. '.' .. n
end

-- Folds norm (weight gamma, bias beta) into the maps that read it; under
-- LayerNorm the folded weights are centred over their input dimension. An
-- RMSNorm with an offset (Gemma's) scales by gamma + offset, and is left at
-- weight 1 - offset.
local function fold_norm(norm, maps, where, level)
  local np = params_of(norm[2])
  local offset = (rawget(norm[2], '_made_with') or {}).offset or 0
  local gamma, beta = f64(np.weight) + offset, np.bias and f64(np.bias)
  local layer = nn.typename(norm[2]) == 'nn.LayerNorm'
  for _, map in ipairs(maps) do
    local W, b = map[1], map[2]
    local w = f64(W)
    if beta and beta:abs():max():item() > 0 then
      if not b then
        error(('%s: fold_ln: %s has a bias to fold into %s, which has none'):format(where, norm[1], map[3]), level)
      end
      set(b, f64(b) + w:matmul(beta))
    end
    w = w * gamma:unsqueeze(1)
    if layer then w = w - w:mean(2, true) end
    set(W, w)
  end
  set(np.weight, torch.ones_like(gamma) - offset)
  if np.bias then set(np.bias, torch.zeros_like(beta)) end
end

-- The head as its own nn.Linear, with a bias where asked: a tied head is
-- untied (a copy of the embedding), a head without a bias is replaced by one
-- with the same weight and a zero bias.
local function own_head(model, names, want_bias)
  local head = model[names.head]
  local weight = head and head.weight or model[names.embed].weight
  if head and (head.bias or not want_bias) then return head end
  local V, C = weight:size(1), weight:size(2)
  local new = nn.Linear(C, V, {bias = want_bias})
  new:to(weight.dtype)
  if weight.device ~= 'cpu' then new:to(weight.device) end
  torch.no_grad(function()
    new.weight:copy_(weight)
    if want_bias then new.bias:zero_() end
  end)
  model[names.head] = new
  if type(model.config) == 'table' then model.config.tied = false end
  return new
end

-- process.check(opts, where, level) -> the steps opts asks for ({fold_ln =
-- true, ...}; nil where none): each given one must be a boolean (an error at
-- `level` above the caller, naming `where`). Other keys are the caller's.
function process.check(opts, where, level)
  local steps
  for _, k in ipairs(KEYS) do
    if opts[k] ~= nil and type(opts[k]) ~= 'boolean' then
      error(('%s: %s must be true or false, got %s'):format(where, k, tostring(opts[k])), level + 1)
    end
    if opts[k] ~= nil then steps = steps or {}; steps[k] = opts[k] end
  end
  return steps
end

-- models.process_weights(model, {fold_ln, center_writing_weights,
-- center_unembed, fold_value_biases}) -> model: TransformerLens's weight
-- processing (its process_weights, in its order) in place, on a model from
-- models.from_pretrained, a pre-norm models.gpt, or any model whose class
-- names its parts (model:processing_names() -> {embed, stack, norm, head},
-- pre-norm blocks of two norms, an attention and an MLP; norms after the
-- parts as well where Block.norm_roles names ln1 and ln2, which fold, and
-- ln1_post, ln2_post, which stay as they are: Gemma 2/3's); the model
-- computes the same probabilities (the logits move by one amount per
-- position where center_unembed is on). model.processed records what was
-- done; save_pretrained refuses a processed model (transformers has no
-- place for what it becomes). center_writing_weights needs LayerNorm
-- (RMSNorm does not take the mean out); a step the model has nothing for is
-- an error (fold_value_biases without value biases); value biases with no
-- output bias to take them (Qwen2) get one, zero before they are folded in,
-- as TransformerLens's b_O. A block whose MLP is an nn.MoE folds its
-- RMSNorm into the router and every expert's gate and up (the router's
-- choices unchanged), as TransformerLens's bridge; under a LayerNorm or a
-- norm shared with the attention it is refused, as the bridge leaves it.
function process.process_weights(model, opts)
  local where = 'models.process_weights'
  opts = options.check(opts, KEYS, where, 2)
  process.check(opts, where, 2)
  local names, why = rawget(model, 'pretrained_names') or model.pretrained_names, nil
  if type(names) ~= 'table' and type(model.processing_names) == 'function' then names, why = model:processing_names() end
  if type(names) ~= 'table' then
    error(('%s: %s'):format(where, why or ('%s declares no layout to process: a model from models.from_pretrained, models.gpt '
      .. "(norm = 'pre'), or a class with processing_names() -> {embed, stack, norm, head} (the names of its children)")
      :format(nn.typename(model))), 2)
  end
  local done = rawget(model, 'processed') or {}
  for _, k in ipairs(KEYS) do
    if opts[k] and done[k] then error(('%s: the model is processed already (%s)'):format(where, k), 2) end
  end
  local blocks = {}
  for name, b in model[names.stack]:named_children() do blocks[#blocks + 1] = parts_of(names.stack .. '.' .. name, b, where, 2) end
  for _, b in ipairs(blocks) do  -- TransformerLens's bridge folds an MoE's ln2 (RMSNorm) into its router and experts alone
    local t = nn.typename(b.ln2[2])
    if nn.typename(b.mlp[2]) == 'nn.MoE' and (opts.fold_ln or opts.center_writing_weights) and (t ~= 'nn.RMSNorm' or b.ln2 == b.ln1) then
      error(('%s: %s: %s.%s is an nn.MoE after %s; TransformerLens folds a mixture of experts\'s own RMSNorm only (it leaves a '
        .. 'norm with a shift or one shared with the attention unfolded, and the experts\' outputs uncentred)'):format(where,
        opts.fold_ln and 'fold_ln' or 'center_writing_weights', b.path, b.mlp[1], b.ln2 == b.ln1 and 'a norm shared with the attention' or t), 2)
    end
  end
  local final = {names.norm, model[names.norm]}
  local layer_norm = nn.typename(final[2]) == 'nn.LayerNorm'
  if opts.center_writing_weights and not layer_norm then
    error(('%s: center_writing_weights needs LayerNorm; %s uses %s, which does not take the mean out of the stream')
      :format(where, nn.typename(model), nn.typename(final[2])), 2)
  end
  local cap = type(model.config) == 'table' and model.config.final_softcap
  if opts.center_unembed and cap then  -- TransformerLens's bridge skips the step here (with a warning)
    error(('%s: center_unembed: the logits are soft-capped (final_logit_softcapping %g), and tanh does not keep a shift of every logit, so the probabilities would change')
      :format(where, cap), 2)
  end
  if opts.fold_value_biases then
    local any = false
    for _, b in ipairs(blocks) do any = any or value_bias(b.attn[2]) ~= nil or (opts.fold_ln and gains_qkv_bias(b)) end
    if not any then
      error(('%s: fold_value_biases: %s has no value biases, so there is nothing to fold (leave the step out)'):format(where,
        nn.typename(model)), 2)
    end
  end
  if opts.fold_ln then
    local np = params_of(final[2])
    local head = own_head(model, names, np.bias ~= nil)
    for _, b in ipairs(blocks) do
      if gains_qkv_bias(b) then b.attn[2] = with_bias(b.block, b.attn, 'qkv_bias') end
      local attn, mlp = readers({b.path .. '.' .. b.attn[1], b.attn[2]}), readers({b.path .. '.' .. b.mlp[1], b.mlp[2]})
      if b.ln2 == b.ln1 then  -- one norm read by both
        for _, r in ipairs(mlp) do attn[#attn + 1] = r end
        fold_norm({b.path .. '.' .. b.ln1[1], b.ln1[2]}, attn, where, 2)
      else
        fold_norm({b.path .. '.' .. b.ln1[1], b.ln1[2]}, attn, where, 2)
        fold_norm({b.path .. '.' .. b.ln2[1], b.ln2[2]}, mlp, where, 2)
      end
    end
    fold_norm(final, {{head.weight, head.bias, names.head}}, where, 2)
  end
  if opts.center_writing_weights then
    own_head(model, names, false)  -- the embedding is about to change; a tied head must not
    for _, c in model:named_children() do
      if nn.typename(c) == 'nn.Embedding' then
        for _, p in pairs(params_of(c)) do local w = f64(p); set(p, w - w:mean(2, true)) end
      end
    end
    for _, b in ipairs(blocks) do
      for _, part in ipairs({b.attn, b.mlp}) do
        local W, bias = writer(part)
        local w = f64(W)
        set(W, w - w:mean(1, true))
        if bias then local v = f64(bias); set(bias, v - v:mean()) end
      end
    end
  end
  if opts.center_unembed then
    local head = own_head(model, names, false)
    local w = f64(head.weight)
    set(head.weight, w - w:mean(1, true))
    if head.bias then local v = f64(head.bias); set(head.bias, v - v:mean()) end
  end
  if opts.fold_value_biases then
    for _, b in ipairs(blocks) do
      local attn = b.attn[2]
      local made = rawget(attn, '_made_with') or {}
      local bv = value_bias(attn)
      if bv then
        local W_O, b_O = writer(b.attn)
        if not b_O then  -- an output bias to take them, zero, as TransformerLens's b_O (Qwen2 has none)
          attn = with_bias(b.block, b.attn, 'out_bias')
          b.attn[2] = attn
          bv = value_bias(attn)
          W_O, b_O = writer(b.attn)
        end
        local H, KV = made.heads, made.kv_heads or made.heads
        local v = f64(bv)
        if KV ~= H then  -- each query head's value bias: its group's
          local D = v:size(1) / KV
          v = v:reshape(KV, 1, D):expand(KV, H / KV, D):reshape(H * D)
        end
        local o = f64(b_O) + f64(W_O):matmul(v)
        if opts.center_writing_weights or done.center_writing_weights then o = o - o:mean() end
        set(b_O, o)
        set(bv, torch.zeros_like(f64(bv)))
      end
    end
  end
  for _, k in ipairs(KEYS) do done[k] = done[k] or opts[k] == true end
  rawset(model, 'processed', done)
  return model
end

-- The steps model.processed records, for print(model): 'fold_ln, center_unembed' or nil.
function process.describe(model)
  local done = rawget(model, 'processed')
  if not done then return nil end
  local out = {}
  for _, k in ipairs(KEYS) do if done[k] then out[#out + 1] = k end end
  return #out > 0 and table.concat(out, ', ') or nil
end

return process
