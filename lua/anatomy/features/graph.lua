-- sae.attribute(model, transcoders, ids, opts): an attribution graph of one
-- prompt, as circuit-tracer 0.5.0's attribute(prompt, model, ...) builds
-- it, before pruning. The local replacement model: the transcoders (a
-- sae.CLT, cross-layer or a per-layer set) in place of the MLPs, the
-- attention patterns and every norm's divisor (its scale) frozen at their
-- values in the clean run, so that the residual stream is linear in what
-- each node writes. The nodes, in circuit-tracer's order:
--   1 .. n_f                active features (layer, position, feature), layer
--                           first, then position, then feature; the first
--                           position's are left out (circuit-tracer's BOS)
--   n_f + 1 .. + L·T        error nodes: layer m's MLP output less its
--                           reconstruction, layer by layer, position within
--   .. + T                  token embeddings, one a position
--   last n_logits           the top logits at the last position
-- adjacency_matrix[t][s] is the direct effect of source s on target t:
-- the gradient of t's input (a feature's encoder direction at its layer's
-- MLP input; a logit's unembedding column less the mean column, at the
-- final norm's output), through the frozen model, on what s writes (its
-- activation times its decoder rows, its error vector, its embedding).
-- Rows of errors and tokens are zero (they are only sources), as are the
-- logits' columns.
-- L layers, T positions, D the model's width, F features a layer.
local torch = require('anatomy.torch')
local options = require('anatomy.torch.options')
local points = require('anatomy.probe.points')
local hooks = require('anatomy.probe.hooks')
local probe = require('anatomy.probe')
local nn = require('anatomy.nn')
local splice = require('anatomy.features.clt_splice')
local Graph = require('anatomy.features.Graph')
local attention = require('anatomy.features.graph_attention')

local M = {}

local WHERE = 'sae.attribute'
M.defaults = {max_n_logits = 10, desired_logit_prob = 0.95, batch_size = 512, update_interval = 4}

local function check_opts(opts)
  opts = options.check(opts, {'max_n_logits', 'desired_logit_prob', 'batch_size', 'max_feature_nodes', 'update_interval',
    'tokenizer'},
    WHERE, 3)
  local o = {}
  for k, v in pairs(M.defaults) do o[k] = v end
  for k, v in pairs(opts) do o[k] = v end
  for _, k in ipairs{'max_n_logits', 'batch_size', 'max_feature_nodes', 'update_interval'} do
    local v = o[k]
    if v == nil and k == 'max_feature_nodes' then goto continue end
    if type(v) ~= 'number' or v ~= v or v < 1 or v ~= math.floor(v) or v == math.huge then
      error(('%s: %s must be a whole number >= 1, got %s'):format(WHERE, k, tostring(v)), 3)
    end
    ::continue::
  end
  local p = o.desired_logit_prob
  if type(p) ~= 'number' or p ~= p or p <= 0 or p > 1 then
    error(('%s: desired_logit_prob must be a number in (0, 1], got %s'):format(WHERE, tostring(p)), 3)
  end
  return o
end

-- ids: a 1-D LongTensor, a (1, T) one, or a table of ids (anatomy's, from 1)
local function check_ids(model, ids)
  if type(ids) == 'table' and not torch.is_tensor(ids) then
    if #ids == 0 then error(WHERE .. ': ids must not be empty', 3) end
    ids = torch.tensor(ids):long()
  end
  if not torch.is_tensor(ids) then
    error(('%s: ids must be a LongTensor (T) or (1, T) of token ids, or a table of them, got %s'):format(WHERE, type(ids)), 3)
  end
  if ids:dim() == 2 and ids:size(1) == 1 then ids = ids:squeeze(1) end
  if ids:dim() ~= 1 or ids:size(1) < 2 then
    error(('%s: ids must be one prompt of at least 2 tokens, (T) or (1, T), got shape (%s)'):format(WHERE,
      table.concat(ids:size(), ', ')), 3)
  end
  if ids:is_floating_point() then error(WHERE .. ': ids must be integers, got ' .. tostring(ids.dtype), 3) end
  local V = model:unembedding():size(1)
  local lo, hi = ids:min():item(), ids:max():item()
  if lo < 1 or hi > V then
    error(('%s: ids must lie in 1..%d (the vocabulary), got %d..%d'):format(WHERE, V, lo, hi), 3)
  end
  return ids:long():to(model:device())
end

-- The points the replacement model reads and writes, per layer, and the
-- frozen ones: every attention pattern and every norm's scale
local function layout(model, c)
  local locs = splice.locations(model, c, WHERE, 3)
  local frozen = {}
  for l = 1, #locs do
    frozen[#frozen + 1] = points.part(model, l, 'attn', 3) .. '.pattern'
    for _, role in ipairs{'ln1', 'ln2', 'ln1_post', 'ln2_post'} do
      local ok, name = pcall(points.part, model, l, role, 1)
      if ok then frozen[#frozen + 1] = name .. '.scale' end
    end
  end
  local final, why = points.final_norm(model)
  if not final then error(('%s: %s'):format(WHERE, why), 3) end
  frozen[#frozen + 1] = final .. '.scale'
  local embed, why2 = points.embedding(model, 'tokens')
  if not embed then error(('%s: %s'):format(WHERE, why2), 3) end
  return locs, frozen, final, embed
end

-- Attaches a capture of each layer's MLP input (the tensor, in the graph)
-- into state.x[l]; returns the handles
local function capture_inputs(model, locs, state)
  local hs = {}
  for l, loc in ipairs(locs) do
    if loc.from_module_input and loc.input == loc.output then
      state.same[l] = true
    else
      hs[#hs + 1] = hooks.replace(model, loc.input, function(t, _, input)
        state.x[l] = loc.from_module_input and input or t
      end)
    end
  end
  return hs
end

-- The clean run: each layer's MLP input and output, the token embeddings,
-- the logits at the last position (no gradient)
local function clean_run(model, locs, final, embed, ids)
  local state = {x = {}, out = {}, same = {}}
  local hs = capture_inputs(model, locs, state)
  for l, loc in ipairs(locs) do
    hs[#hs + 1] = hooks.replace(model, loc.output, function(t, _, input)
      if state.same[l] then state.x[l] = input end
      state.out[l] = t
    end)
  end
  hs[#hs + 1] = hooks.replace(model, embed, function(t) state.tokens = t end)
  local logits = probe.scope(model, function()
    return torch.no_grad(function()
      return hooks.with(hooks.group(hs), function() return model(ids:view(1, -1)) end)
    end)
  end, {mode = 'eval'})
  state.logits = logits[1][ids:size(1)]:float():cpu()
  return state
end

-- Items a chunk, so that a chunk of items of `per` floats each stays near
-- M.chunk floats (2^24, 64 MiB), whatever T (tests make it small)
M.chunk = 2 ^ 24
local function chunk_size(per, total)
  return math.max(1, math.min(total, math.floor(M.chunk / math.max(per, 1))))
end

-- The active features, their positions, features and activations, and the
-- error vectors (L, T, D), from the clean run's MLP inputs and outputs,
-- a chunk of positions at a time (every layer's (P, F) activations of a
-- chunk at once, as the errors need them; none kept beyond the active ones)
local function nodes(c, state, T)
  local L, F = c.cfg.n_layers, c.cfg.d_transcoder
  local P = chunk_size(L * F, T)
  local errors, found = {}, {}
  for m = 1, L do
    errors[m] = torch.zeros({T, c.cfg.d_model}, {dtype = c.W_enc.dtype, device = c.W_enc.device})
    found[m] = {p = {}, f = {}, a = {}}
  end
  torch.no_grad(function() for t0 = 1, T, P do
    local n = math.min(P, T - t0 + 1)
    local xs = {}
    for l = 1, L do
      xs[l] = state.x[l][1]:narrow(1, t0, n):to(c.W_enc.dtype)
      local f = c:encode_layer(xs[l], l):detach()  -- (n, F)
      if t0 == 1 then f[1]:zero_() end  -- circuit-tracer's zero_positions: the first position's features are no nodes
      local on = f:ne(0)  -- row-major: position, then feature
      local dev = on.device
      local r = found[l]
      r.p[#r.p + 1] = torch.arange(t0, t0 + n):to(dev):view(n, 1):expand(n, F):masked_select(on)
      r.f[#r.f + 1] = torch.arange(1, F + 1):to(dev):view(1, F):expand(n, F):masked_select(on)
      r.a[#r.a + 1] = f:masked_select(on)
    end
    for m = 1, L do  -- the reconstruction from the active features alone: a · W_dec_l[f, m − l] added at their positions
      local recon = c.b_dec:select(1, m):view(1, -1):expand(n, c.cfg.d_model):contiguous()
      for l = 1, m do
        local W, r = c:decoder(l), found[l]
        local p, f, a = r.p[#r.p], r.f[#r.f], r.a[#r.a]
        if m - l < W:size(2) and p:size(1) > 0 then
          local src = W:select(2, m - l + 1):index_select(1, f:to(W.device)) * a:to(W.device):view(-1, 1)
          recon = recon:scatter_add(1, (p - t0 + 1):to(W.device):view(-1, 1):expand(p:size(1), c.cfg.d_model), src)
        end
      end
      if c.W_skip then recon = recon + xs[m]:matmul(c.W_skip:select(1, m):t()) end
      errors[m]:narrow(1, t0, n):copy_(state.out[m][1]:narrow(1, t0, n):to(recon.dtype) - recon)
    end
  end end)
  local feats = {layer = {}, pos = {}, feature = {}, sources = {}}
  local layer, pos, idx, acts = feats.layer, feats.pos, feats.feature, {}
  for m = 1, L do errors[m][1]:zero_() end
  for l = 1, L do  -- a layer's features: nodes first .. first + count - 1, their positions, features and activations
    local r = found[l]
    local p, f, a = torch.cat(r.p), torch.cat(r.f), torch.cat(r.a)
    acts[#acts + 1] = a
    local first = #layer + 1
    local plist, flist = p:tolist(), f:tolist()
    for i = 1, #plist do layer[#layer + 1], pos[#pos + 1], idx[#idx + 1] = l, plist[i], flist[i] end
    if #plist > 0 then
      feats.sources[l] = {first = first, count = #plist, pos = p, feature = f:to(c.W_enc.device), activation = a}
    end
  end
  feats.activation = torch.cat(acts)
  return feats, errors
end

-- circuit-tracer's salient logits: the fewest of the top max_n_logits whose
-- probabilities sum to desired_logit_prob or more; their unembedding rows
-- less the mean row
local function targets(model, logits, o)
  local probs = logits:softmax(1)
  local k = math.min(o.max_n_logits, probs:size(1))
  local top_p, top_i = probs:topk(k)
  local cum, cutoff = top_p:cumsum(1), 0
  for i = 1, k do if cum[i]:item() < o.desired_logit_prob then cutoff = i end end
  cutoff = math.min(cutoff + 1, k)
  local tokens = top_i:narrow(1, 1, cutoff)
  local W = model:unembedding():detach():float():cpu()
  local vecs = W:index_select(1, tokens) - W:mean(1, true)
  return tokens, top_p:narrow(1, 1, cutoff), vecs
end

-- One backward pass for a batch of targets: B copies of the prompt through
-- the frozen model; objective Σ_b <input of target b at its position, v_b>.
-- batch: {{kind = 'feature'|'logit', layer, pos, vec}, ...}; returns the
-- gradients at each layer's MLP output (L of (B, T, D)) and at the token
-- embeddings (B, T, D)
local function backward(model, c, locs, frozen, final, embed, ids, batch)
  local B, T = #batch, ids:size(1)
  local L = #locs
  local state = {x = {}, same = {}}
  local leaves, tok_leaf = {}, nil
  local hs = capture_inputs(model, locs, state)
  local blocks = {}  -- the frozen attention's gradient reaches v alone, no pattern kept (graph_attention.lua)
  for m = 1, L do blocks[m] = points.part(model, m, 'attn', 3) end
  local handled = attention.attach(model, blocks, hs)
  for _, name in ipairs(frozen) do
    if not handled[name] then hs[#hs + 1] = hooks.replace(model, name, function(t) return t:detach() end) end
  end
  for m, loc in ipairs(locs) do
    hs[#hs + 1] = hooks.replace(model, loc.output, function(t, _, input)
      if state.same[m] then state.x[m] = input end
      local x = state.x[m]:to(c.W_enc.dtype)
      local skip = c.W_skip and x:matmul(c.W_skip[m]:t()) or x * 0
      local leaf = torch.zeros({B, T, t:size(-1)}, {dtype = c.W_enc.dtype, device = t.device}):requires_grad_(true)
      leaves[m] = leaf
      return (skip + (t:to(skip.dtype) - skip):detach() + leaf):to(t.dtype)
    end)
  end
  hs[#hs + 1] = hooks.replace(model, embed, function(t)
    tok_leaf = torch.zeros(t:size(), {dtype = t.dtype, device = t.device}):requires_grad_(true)
    return t + tok_leaf
  end)
  hs[#hs + 1] = hooks.replace(model, final, function(t) state.final = t end)
  probe.scope(model, function()
    torch.enable_grad(function()
      hooks.with(hooks.group(hs), function() model(ids:view(1, -1):expand(B, T):contiguous()) end)
      local total
      for b, tgt in ipairs(batch) do
        local h = tgt.read and tgt.read() or tgt.kind == 'logit' and state.final or state.x[tgt.layer]  -- read: graph_qk's
        local term = h[b][tgt.pos]:to(tgt.vec.dtype):dot(tgt.vec:to(h.device))
        total = total and total + term or term
      end
      total:backward()
    end)
  end, {frozen = true, mode = 'eval'})
  local grads = {}
  for m = 1, L do
    local g = leaves[m].grad
    grads[m] = g and g:float() or torch.zeros({B, T, c.cfg.d_model}, {device = leaves[m].device})
  end
  return grads, tok_leaf.grad and tok_leaf.grad:float() or torch.zeros({B, T, c.cfg.d_model}, {device = tok_leaf.device})
end

-- The rows (B, n_f + (L + 1)·T) of a batch from its gradients, computed
-- where the gradients are and returned on the CPU. A feature's entry is
-- Σ_{m ≥ l} <grad_m[pos], a · W_dec_l[f, m − l]>, its writes made a chunk
-- of features at a time (about 2^24 floats of B + 1 copies), not kept
local function rows(c, feats, errors, tokvecs, grads, tgrad, T)
  local L = c.cfg.n_layers
  local B, D = tgrad:size(1), tgrad:size(3)
  local n = #feats.layer
  local dev = tgrad.device
  local out = torch.zeros({B, n + (L + 1) * T}, {device = dev})
  for l, src in pairs(feats.sources) do
    local W = c:decoder(l)
    local width = W:size(2)
    local size = chunk_size((B + 1) * width * D, src.count)
    for s = 1, src.count, size do
      local k = math.min(size, src.count - s + 1)
      local f, a = src.feature:narrow(1, s, k), src.activation:narrow(1, s, k)
      local writes = (W:detach():index_select(1, f) * a:to(W.device):view(-1, 1, 1)):float():to(dev)  -- (k, width, D)
      local at = src.pos:narrow(1, s, k):to(dev)
      local acc = torch.zeros({B, k}, {device = dev})
      for j = 1, width do
        local g = grads[l + j - 1]:index_select(2, at)  -- (B, k, D)
        acc = acc + (g * writes:select(2, j):unsqueeze(1)):sum(-1)
      end
      out:narrow(2, src.first + s - 1, k):copy_(acc)
    end
  end
  for m = 1, L do
    out:narrow(2, n + (m - 1) * T + 1, T):copy_((grads[m] * errors[m]:float():to(dev):unsqueeze(1)):sum(-1))
  end
  out:narrow(2, n + L * T + 1, T):copy_((tgrad * tokvecs:float():to(dev):unsqueeze(1)):sum(-1))
  return out
end

-- circuit-tracer's compute_partial_influences: each node's influence on the
-- logits through the rows computed so far (E, row_node[r] the node of row
-- r), by power iteration over the row-normalised absolute rows
local function partial_influences(E, probs, row_node)
  local norm = E:abs()
  norm = norm / norm:sum(2, true):clamp_min(1e-8)
  local ncols, K = E:size(2), probs:size(1)
  local prod = torch.zeros({ncols}, {device = 'cpu'})
  prod:narrow(1, ncols - K + 1, K):copy_(probs:float():cpu())
  local idx = torch.tensor({unpack(row_node, 1, E:size(1))}):long():cpu()
  local total = torch.zeros({ncols}, {device = 'cpu'})
  for _ = 1, 128 do
    prod = prod:index_select(1, idx):view(1, -1):matmul(norm):view(-1)
    if not prod:ne(0):any():item() then return total end
    total = total + prod
  end
  error(WHERE .. ': the partial influences did not converge in 128 steps', 3)
end

-- sae.attribute(model, transcoders, ids, {max_n_logits = 10, desired_logit_prob = 0.95, batch_size = 512, max_feature_nodes,
-- update_interval = 4}) -> sae.Graph: circuit-tracer's attribute(prompt, model, ...) (docs/graphs.md; max_feature_nodes: only
-- that many features, visited by their influence on the logits, get rows and columns). ids: one prompt's token ids (a
-- LongTensor (T) or (1, T), or a table), a BOS first (its features and errors are no nodes), or a text (tokenized by
-- opts.tokenizer or the model's, a BOS put first as circuit-tracer's ensure_tokenized: graph_prompt.lua); transcoders: a sae.CLT
-- (cross-layer or a per-layer set). graph: adjacency_matrix (N, N), rows targets and columns sources, nodes in
-- circuit-tracer's order (active features, error nodes layer by layer, token embeddings, logits); active_features
-- (n, 3) (layer, position, feature), activation_values (n), selected_features (the feature nodes), logit_tokens (K),
-- logit_probabilities (K), input_tokens (T), n_layers, n_pos; every index from 1 (circuit-tracer's are these less 1).
function M.attribute(model, c, ids, opts)
  if type(model) ~= 'table' or type(model.unembedding) ~= 'function' then
    error(WHERE .. ': model must be a language model (one with model:unembedding())', 2)
  end
  if nn.typename(c) ~= 'sae.CLT' then
    error(('%s: transcoders must be a sae.CLT (sae.clt, sae.load_clt), got %s'):format(WHERE, nn.typename(c) or type(c)), 2)
  end
  local o = check_opts(opts)
  ids = check_ids(model, require('anatomy.features.graph_prompt').ids(model, ids, o.tokenizer, WHERE, 2))
  hooks.require_clean(model, WHERE, 2)  -- an ablation or splice left attached would be attributed as the model
  -- a model that soft-caps its logits (Gemma 2's final_softcap): the logits and their probabilities are chosen from
  -- the capped logits and the edges go to the logits before the cap, as circuit-tracer attributes them
  local T, L = ids:size(1), c.cfg.n_layers
  local locs, frozen, final, embed = layout(model, c)
  local state = clean_run(model, locs, final, embed, ids)
  local feats, errors = nodes(c, state, T)
  state.x, state.out = nil, nil  -- (L, T, D) each: the errors hold what is needed
  local n = #feats.layer
  local logit_tokens, logit_probs, logit_vecs = targets(model, state.logits, o)
  local K = logit_tokens:size(1)
  local offset = n + (L + 1) * T
  local N = offset + K
  local tokvecs = state.tokens[1]:detach()
  local max_f = math.min(o.max_feature_nodes or n, n)
  -- rows as circuit-tracer fills them: the logits', then each feature's as it is visited
  local E = torch.zeros({max_f + K, N}, {device = 'cpu'})
  local row_node, st = {}, 0
  local function run(batch, nodes_of)
    local grads, tgrad = backward(model, c, locs, frozen, final, embed, ids, batch)
    local r = rows(c, feats, errors, tokvecs, grads, tgrad, T):cpu()
    for b = 1, #batch do
      st = st + 1
      E[st]:narrow(1, 1, offset):copy_(r[b])
      row_node[st] = nodes_of[b]
    end
  end
  for s = 1, K, o.batch_size do
    local batch, of = {}, {}
    for i = s, math.min(s + o.batch_size - 1, K) do
      batch[#batch + 1], of[#of + 1] = {kind = 'logit', pos = T, vec = logit_vecs[i]}, offset + i
    end
    run(batch, of)
  end
  local visited, n_visited = {}, 0
  while n_visited < max_f do
    local pending = {}
    if max_f == n then
      for i = 1, n do pending[i] = i end
    else  -- the unvisited features most influential on the logits through the rows so far
      local influences = partial_influences(E:narrow(1, 1, st), logit_probs, row_node)
      local _, rank = influences:narrow(1, 1, n):sort(1, true)
      local size = math.min(o.update_interval * o.batch_size, max_f - n_visited)
      for _, i in ipairs(rank:narrow(1, 1, math.min(n, n_visited + size)):tolist()) do  -- holds size unvisited
        if not visited[i] then pending[#pending + 1] = i end
        if #pending == size then break end
      end
    end
    for s = 1, #pending, o.batch_size do
      local batch, of = {}, {}
      for j = s, math.min(s + o.batch_size - 1, #pending) do
        local i = pending[j]
        local l, f = feats.layer[i], feats.feature[i]
        batch[#batch + 1], of[#of + 1] = {kind = 'feature', layer = l, pos = feats.pos[i], vec = c.W_enc[l][f]:detach()}, i
        visited[i] = true
      end
      n_visited = n_visited + #batch
      run(batch, of)
    end
  end
  local selected = {}
  for i = 1, n do if visited[i] then selected[#selected + 1] = i end end
  -- the adjacency's nonzero rows: the visited features' by node, then the logits'; the columns of the features visited,
  -- then every other node's (circuit-tracer's selection), copied from E a chunk of rows at a time. The dense (N, N)
  -- matrix is made from them when g.adjacency_matrix is first read (Graph.lua)
  local cols = {}
  for _, i in ipairs(selected) do cols[#cols + 1] = i end
  local rest = torch.arange(n + 1, N + 1):long():cpu()
  local colidx = #cols > 0 and torch.cat({torch.tensor(cols):long():cpu(), rest}) or rest
  local _, order = torch.tensor(row_node):long():cpu():sort(1)  -- features by node, then the logits
  local R = torch.zeros({st, colidx:size(1)}, {device = 'cpu'})
  local step = chunk_size(colidx:size(1), st)
  for s = 1, st, step do
    local k = math.min(step, st - s + 1)
    R:narrow(1, s, k):copy_(E:index_select(1, order:narrow(1, s, k)):index_select(2, colidx))
  end
  E = nil
  local active = (n > 0 and torch.tensor({feats.layer, feats.pos, feats.feature}):long():t():contiguous()
    or torch.zeros(0, 3):long()):cpu()
  return Graph.new{
    model = model, transcoders = c,
    input_tokens = ids:cpu():clone(), active_features = active, activation_values = feats.activation:float():cpu(),
    selected_features = (#selected > 0 and torch.tensor(selected):long() or torch.zeros(0):long()):cpu(), adjacency_rows = R,
    logit_tokens = logit_tokens:long():cpu(), logit_probabilities = logit_probs:float():cpu(), n_layers = L, n_pos = T,
  }
end

-- for graph_qk.lua, which runs the same replacement model toward an attention's queries and keys
M.internal = {layout = layout, capture_inputs = capture_inputs, clean_run = clean_run, nodes = nodes, backward = backward, rows = rows}

return M
