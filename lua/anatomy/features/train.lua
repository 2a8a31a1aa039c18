-- sae.train: an SAE (or a transcoder) trained on activations streamed from
-- a model. The loss, in units of the activations' variance so that one set
-- of coefficients serves every model and layer:
--   ‖x̂ − x‖² / σ²                       reconstruction (σ² = E‖x − x̄‖²)
--   + l1 · Σ f·‖W_dec row‖ / σ           relu: the L1 penalty
--   + l0 · Σ H(pre − θ)                  jumprelu: L0, θ learnt through the
--                                        straight-through estimate
--   + aux_coefficient · ‖ê − e‖² / σ²    topk, batchtopk: the auxiliary-k loss
-- The auxiliary-k loss revives dead features (no activation in dead_after
-- rows): the k_aux largest pre-activations among the dead ones reconstruct
-- the residual e = x − x̂ alone, so their directions move towards what the
-- live features miss, and the gradient reaches features that the top-k
-- never selects. It needs no resampling schedule and keeps the optimiser's
-- state meaningful (resampling rewrites weights mid-run; Gao et al. 2024
-- found auxiliary-k enough). ReLU and JumpReLU SAEs are only tracked.
-- Decoder rows stay unit norm: the gradient's component along each row is
-- removed before the step and the rows renormalised after it.
local torch = require('anatomy.torch')
local native = require('anatomy.torch.native')
local optim = require('anatomy.optim')
local options = require('anatomy.torch.options')
local scope = require('anatomy.probe.scope')
local Store = require('anatomy.features.store')
local SAE = require('anatomy.features.SAE')
local CLT = require('anatomy.features.CLT')
local clt_train = require('anatomy.features.clt_train')
local json = require('anatomy.io.json')
local rng = require('anatomy.train.checkpoint')  -- rng_states, restore_rng
local fs = require('anatomy.io.fs')

local M = {}

M.allowed = {'point', 'width', 'kind', 'k', 'l1', 'l0', 'steps', 'batch', 'lr', 'seq', 'sequences', 'buffer', 'seed',
  'dead_after', 'k_aux', 'aux_coefficient', 'transcoder', 'cache', 'log_every', 'warmup', 'bandwidth', 'quiet', 'checkpoint', 'checkpoint_every', 'resume'}
-- sae.train_clt's: sae.train's but the point, and where the features read and write (features/clt_train.lua)
M.allowed_clt = {'cross_layer', 'skip', 'input_hook', 'output_hook', 'tanh_c'}
for _, k in ipairs(M.allowed) do
  if k ~= 'point' and k ~= 'transcoder' then M.allowed_clt[#M.allowed_clt + 1] = k end
end

-- A whole-number option of sae.train, checked in M.settings: an error
-- names the line that called sae.train (options.whole <- here <-
-- M.settings <- M.train, which sae.train tail-calls).
local function whole(v, name, where, default, low)
  local r = options.whole(v, name, where, default, low, 5)
  return r
end

local function number_in(v, name, low, high, where, default)
  if v == nil then return default end
  if type(v) ~= 'number' or v ~= v or v < low or v > high then
    error(('%s: %s must be a number in [%g, %g], got %s'):format(where, name, low, high, tostring(v)), 4)
  end
  return v
end

-- The options, checked and completed before anything runs; shape: a CLT's (sae.train_clt), else nil.
function M.settings(model, point, opts, where, shape)
  local o = {}
  if type(opts.kind) ~= 'nil' and not (shape and CLT or SAE).kinds[opts.kind] then
    local names = shape and {'jumprelu', 'relu', 'topk'} or {'topk', 'relu', 'jumprelu', 'batchtopk'}
    local near = options.closest(tostring(opts.kind), names)
    local list = "'" .. table.concat(names, "', '", 1, #names - 1) .. "' or '" .. names[#names] .. "'"
    error(("%s: kind must be %s, got %s%s"):format(where, list, tostring(opts.kind),
      near and (" (did you mean '%s'?)"):format(near) or ''), 3)
  end
  o.kind = opts.kind or (shape and 'jumprelu' or 'topk')
  o.steps = whole(opts.steps, 'steps', where, 2000)
  o.batch = whole(opts.batch, 'batch', where, 1024)
  o.seq = whole(opts.seq, 'seq', where, math.min(model.context and model:context() or 128, 128))
  o.sequences = whole(opts.sequences, 'sequences', where, 32)
  o.buffer = whole(opts.buffer, 'buffer', where, 16 * o.batch)
  o.seed = whole(opts.seed, 'seed', where, 1, 0)
  o.log_every = whole(opts.log_every, 'log_every', where, math.max(1, math.floor(o.steps / 10)))
  o.warmup = whole(opts.warmup, 'warmup', where, math.min(100, math.floor(o.steps / 10)), 0)
  o.lr = number_in(opts.lr, 'lr', 0, 1, where, 1e-3)
  o.l1 = number_in(opts.l1, 'l1', 0, math.huge, where, 0.3)
  o.l0 = number_in(opts.l0, 'l0', 0, math.huge, where, 1e-3)
  o.bandwidth = number_in(opts.bandwidth, 'bandwidth', 0, math.huge, where, 0.001)
  o.aux_coefficient = number_in(opts.aux_coefficient, 'aux_coefficient', 0, math.huge, where, 1 / 32)
  o.tanh_c = shape and number_in(opts.tanh_c, 'tanh_c', 0, math.huge, where, 1) or nil
  if opts.transcoder ~= nil and type(opts.transcoder) ~= 'boolean' then
    error(('%s: transcoder must be true or false, got %s'):format(where, tostring(opts.transcoder)), 3)
  end
  o.transcoder = opts.transcoder == true
  if opts.cache ~= nil and (type(opts.cache) ~= 'string' or opts.cache == '') then
    error(('%s: cache must be a folder name, got %s'):format(where, tostring(opts.cache)), 3)
  end
  o.cache = opts.cache
  if opts.quiet ~= nil and type(opts.quiet) ~= 'boolean' then error(('%s: quiet must be true or false'):format(where), 3) end
  o.print = opts.quiet ~= true
  if opts.k ~= nil and o.kind ~= 'topk' and o.kind ~= 'batchtopk' then
    error(("%s: k is for kind 'topk' or 'batchtopk', not '%s'"):format(where, o.kind), 3)
  end
  local width, k = whole(opts.width, 'width', where), whole(opts.k, 'k', where)
  if width and k and k > width then error(('%s: k must be at most width %d, got %d'):format(where, width, k), 3) end
  whole(opts.k_aux, 'k_aux', where)
  whole(opts.dead_after, 'dead_after', where)
  return o
end

-- The widths, once the point's width D is known: features (default 8·D), k
-- (topk, batchtopk; default 32), k_aux (default D/2) and dead_after (rows
-- without an activation before a feature counts as dead; default 5·buffer).
function M.sizes(o, opts, D, where)
  o.width = options.whole(opts.width, 'width', where, 8 * D)
  if o.kind == 'topk' or o.kind == 'batchtopk' then
    o.k = options.whole(opts.k, 'k', where, math.min(32, o.width))
    if o.k > o.width then error(('%s: k must be at most width %d, got %d'):format(where, o.width, o.k), 3) end
  end
  o.k_aux = math.min(options.whole(opts.k_aux, 'k_aux', where, math.max(1, math.floor(D / 2))), o.width)
  o.dead_after = options.whole(opts.dead_after, 'dead_after', where, 5 * o.buffer)
end

-- One step's losses: reconstruction, sparsity, auxiliary; the features and reconstruction for the progress line.
local function losses(s, o, x, target, var, dead)
  local pre = s:pre(x)
  local f, extra = s:activate(pre, true)
  local recon = f:matmul(s.W_dec) + s.b_dec
  local err = recon - target
  local mse = err:square():sum(-1):mean() / var
  local total, sparsity, aux = mse, nil, nil
  if o.kind == 'relu' then
    sparsity = (f * s.W_dec:norm(2, -1)):sum(-1):mean() / math.sqrt(var)
    total = total + o.l1 * sparsity
  elseif o.kind == 'jumprelu' then
    sparsity = extra:sum(-1):mean()
    total = total + o.l0 * sparsity
  else
    local n_dead = dead:sum():item()
    if n_dead > 0 and o.aux_coefficient > 0 then
      local k = math.min(o.k_aux, n_dead)
      local masked = pre:masked_fill(dead:logical_not():unsqueeze(1), -math.huge)
      local values, indices = masked:topk(k, -1)
      local fa = torch.zeros_like(pre):scatter(-1, indices, values:relu())
      local e = (target - recon):detach()
      aux = (fa:matmul(s.W_dec) - e):square():sum(-1):mean() / var
      total = total + o.aux_coefficient * aux
    end
  end
  return total, mse, f, recon, extra
end

-- The settings a checkpoint must share with the run that resumes it.
local kept = {'kind', 'width', 'k', 'batch', 'seq', 'sequences', 'buffer', 'seed', 'transcoder', 'l1', 'l0', 'bandwidth', 'k_aux',
  'aux_coefficient', 'dead_after', 'lr', 'warmup', 'tanh_c', 'cross_layer', 'skip', 'input_hook', 'output_hook'}

-- A checkpoint: the SAE, the optimiser's state, the rows since each
-- feature fired, the store's shuffled buffer and position, the random
-- generator, the step and the history, in one safetensors file (atomic).
local function save_checkpoint(path, s, opt, since, store, step, history, o)
  local t = {since = since, store_x = store.x, store_at = torch.tensor(store.at, {dtype = 'int64'})}
  for k, v in pairs(rng.rng_states(store.x.device)) do t[k] = v end  -- the shuffles draw on the device
  if store.y then t.store_y = store.y end
  for name, p in s:named_parameters() do t['sae.' .. name] = p:detach() end
  local variance = s.cfg.variance
  if torch.is_tensor(variance) then t.variance, variance = variance, 'tensor' else variance = ('%.17g'):format(variance) end
  for name, v in pairs(opt:state_tensors('optim.')) do t[name] = v end
  local settings = {}
  for _, k in ipairs(kept) do settings[k] = o[k] end
  torch.save_safetensors(path, t, {format = 'anatomy-sae-checkpoint', step = tostring(step), point = store.point,
    settings = json.encode(settings), history = json.encode(history), variance = variance,
    bandwidth = s.cfg.bandwidth and ('%.17g'):format(s.cfg.bandwidth) or nil, d_in = tostring(s.cfg.d_in or s.cfg.d_model),
    shards_read = tostring(store.shards_read), rows_gathered = tostring(store.rows_gathered),
    rows_from_cache = tostring(store.rows_from_cache), apply_b_dec_to_input = tostring(s.cfg.apply_b_dec_to_input)})
end

-- The checkpoint at path, checked against this run's point and settings.
local function read_checkpoint(path, point, o, where)
  local ok, t, meta = pcall(torch.load_safetensors, path)
  if not ok then error(('%s: resume: %s'):format(where, tostring(t):gsub('^torch%.load_safetensors: ', '')), 3) end
  if meta.format ~= 'anatomy-sae-checkpoint' then error(("%s: resume: '%s' is not an SAE checkpoint of sae.train"):format(where, path), 3) end
  if meta.point ~= point then
    error(("%s: resume: the checkpoint trained an SAE at %s, this run reads %s"):format(where, meta.point, point), 3)
  end
  local step = tonumber(meta.step)
  if step > o.steps then error(('%s: resume: the checkpoint is at step %d, past steps = %d'):format(where, step, o.steps), 3) end
  return t, meta, step
end

-- The run's settings (complete: M.sizes has run) against the checkpoint's.
local function check_settings(meta, o, where)
  local settings = json.decode(meta.settings)
  for _, k in ipairs(kept) do
    local a, b = settings[k], o[k]
    if a == json.null then a = nil end
    if a ~= b then
      error(('%s: resume: the checkpoint was trained with %s = %s, this run has %s'):format(where, k, tostring(a), tostring(b)), 3)
    end
  end
end

-- A fresh SAE for the first rows of the store: b_dec at the target's mean,
-- the loss's scale σ² its variance (a transcoder's encoder scaled to start
-- its features at the output's size), a JumpReLU's threshold and bandwidth
-- in the activations' units.
local function fresh(model, store, o, opts, point, where)
  local first_x, first_y = store:next(o.batch)
  local D, D_out = first_x:size(2), (first_y or first_x):size(2)
  if o.transcoder and D ~= D_out then
    error(('%s: a transcoder here maps a width to itself; %s takes %d and gives %d'):format(where, point, D, D_out), 3)
  end
  M.sizes(o, opts, D, where)
  local s = SAE._trained(o, D, point, model)
  local sample_x, sample_y = store.x, store.y
  local target_sample = sample_y or sample_x
  local mean = target_sample:mean(1)
  local var = (target_sample - mean):square():sum(-1):mean():item()
  if not (var > 0) then error(('%s: the activations at %s do not vary (variance %s)'):format(where, point, tostring(var)), 3) end
  torch.no_grad(function()
    s.b_dec:copy_(mean)
    if o.transcoder then
      local var_in = (sample_x - sample_x:mean(1)):square():sum(-1):mean():item()
      if var_in > 0 then s.W_enc:mul_(math.sqrt(var / var_in)) end
    end
  end)
  if s.threshold and o.kind == 'jumprelu' then
    s.cfg.bandwidth = o.bandwidth * math.sqrt(var / D)
    torch.no_grad(function() s.threshold:fill_(s.cfg.bandwidth) end)
  end
  s.cfg.variance = var
  return s, first_x, first_y
end

-- sae.train(model, corpus, opts) -> s, history (see lua/anatomy/features/init.lua); with shape
-- ({n_layers, cross_layer, skip, input_hook, output_hook, locations}: sae.train_clt's), a sae.CLT
function M.train(model, corpus, opts, where, shape)
  local point = opts.point
  local o = M.settings(model, point, opts, where, shape)
  if shape then o.cross_layer, o.skip, o.input_hook, o.output_hook = shape.cross_layer, shape.skip, shape.input_hook, shape.output_hook end
  local resume
  if opts.resume ~= nil then
    if type(opts.resume) ~= 'string' then error(('%s: resume must be a checkpoint path, got %s'):format(where, type(opts.resume)), 2) end
    if not fs.exists(opts.resume) then error(("%s: resume: no file '%s'"):format(where, opts.resume), 2) end
  end
  if opts.checkpoint ~= nil and (type(opts.checkpoint) ~= 'string' or opts.checkpoint == '') then
    error(('%s: checkpoint must be a file path, got %s'):format(where, tostring(opts.checkpoint)), 2)
  end
  local every = options.whole(opts.checkpoint_every, 'checkpoint_every', where, o.log_every)
  local checkpoint  -- a resumed run's tensors and settings, read and checked before anything runs
  if opts.resume then
    local t, meta, step = read_checkpoint(opts.resume, point, o, where)
    local D = tonumber(meta.d_in)
    M.sizes(o, opts, D, where)
    check_settings(meta, o, where)
    checkpoint = {t = t, meta = meta, step = step, D = D}
  end
  -- in eval mode, and the model's modes, hooks and grad state back after, an error included
  return scope.run(model, function()
    torch.manual_seed(o.seed)
    local store = Store.new(model, corpus, point, {seq = o.seq, batch = o.sequences, buffer = o.buffer,
      transcoder = o.transcoder or shape ~= nil, layers = shape and shape.locations, cache = o.cache, seed = o.seed, where = where})
    local s, x, y, first, history, var
    if checkpoint then
      local t, meta, step, D = checkpoint.t, checkpoint.meta, checkpoint.step, checkpoint.D
      local device = model:device()  -- the file reads onto the default device
      if shape then
        s = clt_train.build(o, D, model, shape)
        s.cfg.variance = t.variance:to(device)
      else
        s = SAE._trained(o, D, point, model)
        s.cfg.apply_b_dec_to_input = meta.apply_b_dec_to_input == 'true'
        s.cfg.variance = tonumber(meta.variance)
      end
      s.cfg.bandwidth = tonumber(meta.bandwidth)
      torch.no_grad(function()
        for name, p in s:named_parameters() do p:copy_(t['sae.' .. name]) end
      end)
      store.x, store.y, store.at = t.store_x:to(device), t.store_y and t.store_y:to(device), t.store_at:item()
      store.shards_read = tonumber(meta.shards_read)
      store.rows_gathered, store.rows_from_cache = tonumber(meta.rows_gathered), tonumber(meta.rows_from_cache)
      if store.shards and store.shards_read > #store.shards then
        error(('%s: resume: the checkpoint read %d shards of the activation cache, which holds %d'):format(where,
          store.shards_read, #store.shards), 0)
      end
      history = json.decode(meta.history)
      resume = {t = t, step = step}
      first = step + 1
    else
      if shape then
        s, x, y = clt_train.fresh(model, store, o, shape, function(D) M.sizes(o, opts, D, where) end, where)
      else
        s, x, y = fresh(model, store, o, opts, point, where)
      end
      history = {step = {}, loss = {}, l0 = {}, explained_variance = {}, dead = {}}
      first = 1
    end
    var = s.cfg.variance
    local learnt = {}  -- a BatchTopK's threshold is a running mean, not learnt
    for _, p in ipairs(s:parameters()) do if p.requires_grad then learnt[#learnt + 1] = p end end
    local opt = optim.AdamW(learnt, {lr = o.lr, betas = {0.9, 0.999}, weight_decay = 0})
    local since = torch.zeros(shape and {shape.n_layers, o.width} or {o.width}, {device = model:device()})  -- rows since each feature last fired
    if resume then
      opt:load_state_tensors(resume.t, 'optim.')
      since:copy_(resume.t.since)
      rng.restore_rng(resume.t, since.device)
    end
    local t0 = native.now()
    for step = first, o.steps do
      if not (step == first and x) then x, y = store:next(o.batch) end
      local target = y or x
      local dead = since:gt(o.dead_after)
      opt:set_lr(o.lr * math.min(1, step / math.max(1, o.warmup)))
      opt:zero_grad()
      local total, mse, f, _, extra = (shape and clt_train.losses or losses)(s, o, x, target, var, dead)
      total:backward()
      if not shape then s:remove_parallel_gradient() end  -- a CLT's decoders are weighed by their norms, not held at 1
      opt:step()
      if not shape then s:normalize_decoder() end
      torch.no_grad(function()
        local fired = f:gt(0):any(1)
        since:add_(o.batch):masked_fill_(fired, 0)
        if o.kind == 'jumprelu' then s.threshold:clamp_(0) end
        if o.kind == 'batchtopk' then  -- the threshold used after training: a running mean of each batch's
          local th = s.threshold
          if step == 1 then th:fill_(extra) else th:mul_(0.99):add_(0.01 * extra) end
        end
      end)
      if step % o.log_every == 0 or step == o.steps then
        local l0 = f:gt(0):float():sum(-1):mean():item()
        local ev = 1 - mse:item()
        local dead_share = since:gt(o.dead_after):float():mean():item()
        local n = #history.step + 1
        history.step[n], history.loss[n], history.l0[n], history.explained_variance[n], history.dead[n] =
          step, total:item(), l0, ev, dead_share
        if o.print then
          print(('%s step %5d/%d  loss %.4f  L0 %.1f  explained variance %.3f  dead %.1f%%  (%.0f rows/s)'):format(
            shape and 'clt' or 'sae', step, o.steps, total:item(), l0, ev, 100 * dead_share, (step - first + 1) * o.batch / math.max(1e-9, native.now() - t0)))
        end
      end
      if opts.checkpoint and (step % every == 0 or step == o.steps) then
        save_checkpoint(opts.checkpoint, s, opt, since, store, step, history, o)
      end
    end
    s.cfg.trained = {steps = o.steps, batch = o.batch, lr = o.lr, seq = o.seq, sequences = o.sequences, seed = o.seed,
      rows = o.steps * o.batch,
      rows_from_model = store.rows_gathered, rows_from_cache = store.rows_from_cache, l1 = o.kind == 'relu' and o.l1 or nil,
      l0 = o.kind == 'jumprelu' and o.l0 or nil, dead_after = o.dead_after, k_aux = o.k_aux, aux_coefficient = o.aux_coefficient,
      resumed_at = resume and resume.step or nil}
    s.cfg.dead_after = o.dead_after
    rawset(s, 'since_fired', since)
    return s, history
  end, {mode = 'eval'})
end

return M
