-- Sampling from language models: generate(model, ids, opts) for any module
-- that maps token ids (B, T) to logits (B, T, V), and sample(corpus, model,
-- prompt, opts) for text in and text out. They are nn.Module's generate and
-- data.Corpus's sample, added here: generation reads the KV cache and pads
-- through probe, above nn and data.
local torch = require('anatomy.torch')
local options = require('anatomy.torch.options')
local nn = require('anatomy.nn')
local data = require('anatomy.data')
local inputs = require('anatomy.probe.inputs')
local Cache = require('anatomy.probe.cache')
local scope = require('anatomy.probe.scope')
local generate = {}

-- The next-token distribution's sample from logits (B, V).
local function draw(logits, temperature, top_k)
  if temperature == 0 then return logits:argmax(-1, true) end
  logits = logits / temperature
  if top_k and top_k < logits:size(-1) then
    local v = logits:topk(top_k, -1)
    logits = logits:masked_fill(logits:lt(v:narrow(-1, top_k, 1)), -math.huge)
  end
  return logits:softmax(-1):multinomial(1)               -- (B, 1), 1-based ids
end

-- The option values generate takes, checked when given.
local function check_options(opts, where)
  opts = options.check(opts, {'max_new', 'temperature', 'top_k', 'seed', 'kv_cache', 'return_cache', 'attention_mask'}, where, 4)
  options.whole(opts.max_new, 'max_new', where, nil, 0, 4)
  options.whole(opts.top_k, 'top_k', where, nil, 1, 4)
  local t = opts.temperature
  if t ~= nil and (type(t) ~= 'number' or t ~= t or t < 0 or t == math.huge) then
    error(('%s: temperature must be a finite number >= 0, got %s'):format(where, tostring(t)), 4)
  end
  if opts.kv_cache ~= nil and type(opts.kv_cache) ~= 'boolean' then
    error(('%s: kv_cache must be true or false, got %s'):format(where, tostring(opts.kv_cache)), 4)
  end
  local rc = opts.return_cache
  if rc ~= nil and type(rc) ~= 'boolean' and type(rc) ~= 'table' and type(rc) ~= 'string' then
    error(('%s: return_cache must be true, a glob or a list of globs, got %s'):format(where, type(rc)), 4)
  end
  return opts
end

-- (Errors name the caller of model:generate, through which this is called.)
-- generate.generate(model, ids, {max_new = 200, temperature = 1.0, top_k =
-- nil, seed = nil, kv_cache, return_cache}) -> ids[, steps]
-- ids: (B, T) or (T) int64 prompt; returns the prompt followed by max_new
-- sampled tokens. The context is cropped to the model's seq (its position
-- table). temperature = 0 picks the most likely token.
-- kv_cache: the model reads only each step's new token, its attention
-- keeping the keys and values of the positions before (model:kv_cacheable();
-- unset: used when the model can, true: an error when it cannot, false:
-- the whole context every step). Past the model's seq the context is
-- cropped, and the cache dropped (cropping moves every position); a model
-- with kv_refill(past, total) true runs the whole context again at that
-- step, its cache refilled (Phi-3's long RoPE, as transformers' generate).
-- Probes and interventions act at every step: on the new position alone
-- with the cache, on the whole context without. return_cache = true (or
-- globs, as run_with_cache's filter): also each step's activations, a list
-- of caches (steps[1]: the prompt's positions; with the cache each later
-- step holds its one new position).
-- attention_mask (B, T), true (1) at real tokens: prompts of different
-- lengths, padded on the left (each ends at the last column; probe.to_ids
-- with {padding_side = 'left'} makes them); positions count real tokens and
-- no step reads a padded one.
function generate.generate(self, ids, opts)
  local where = 'generate'
  opts = check_options(opts, where)
  local squeeze = ids:dim() == 1
  if squeeze then ids = ids:unsqueeze(1) end
  -- the prompt goes where the model is (a corpus encodes on the CPU)
  if ids.device ~= self:device() then ids = ids:to(self:device()) end
  if opts.seed then torch.manual_seed(opts.seed) end
  local seq = self:context() or math.huge
  local stateful = rawget(self, 'step') ~= nil or self.step ~= nil
  local cached = false
  if not stateful and opts.kv_cache ~= false then
    local ok, why = self:kv_cacheable()
    if opts.kv_cache == true and not ok then error(('%s: kv_cache = true, but %s'):format(where, why), 3) end
    cached = ok
  elseif stateful and opts.kv_cache == true then
    error(('%s: kv_cache = true, but %s runs as an RNN (its state is its cache)'):format(where, nn.typename(self)), 3)
  end
  local mask = opts.attention_mask ~= nil and inputs.check_mask(ids, opts.attention_mask, where) or nil
  if mask and not mask:select(2, ids:size(2)):all():item() then
    error(('%s: attention_mask pads on the right; generation needs the padding on the left (padding_side = \'left\')'):format(where), 3)
  end
  if mask then
    local ok, why = self:paddable()
    if not ok then error(('%s: attention_mask given, but %s'):format(where, why), 3) end
    if stateful then error(('%s: attention_mask given, but %s runs as an RNN'):format(where, nn.typename(self)), 3) end
    mask = mask:to(ids.device)
  end
  local filter = opts.return_cache
  if filter == true then filter = nil end
  local steps = opts.return_cache and opts.return_cache ~= false and {} or nil
  local state, fed = nil, 0  -- fed: the positions the cache holds
  -- in eval mode, the cache on while it can follow, the padding taken off
  -- and the mode back after, an error included
  scope.run(self, function() torch.no_grad(function()
    for _ = 1, opts.max_new or 200 do
      if cached and ids:size(2) > seq then  -- cropping from here on: every position moves, the cache cannot follow
        self:kv_cache(false)
        cached = false
      end
      -- a model whose cached keys no longer fit the positions to come says so
      -- (model:kv_refill(past, total): Phi-3's long RoPE) and reads the whole context again
      if cached and fed > 0 and self.kv_refill and self:kv_refill(fed, ids:size(2)) then
        self:kv_cache(false)
        self:kv_cache(true)
        fed = 0
      end
      local context, context_mask
      if cached then
        context = ids:narrow(2, fed + 1, ids:size(2) - fed)
        if mask then self:set_padding(mask) end  -- the cached positions and the new ones
      else
        context = ids:size(2) > seq and ids:narrow(2, ids:size(2) - seq + 1, seq) or ids
        context_mask = mask and mask:narrow(2, ids:size(2) - context:size(2) + 1, context:size(2))
        if context_mask and context_mask:all():item() then context_mask = nil end
      end
      local last
      if stateful then
        last, state = self:step(context, state)
      else
        local logits
        if steps then
          local step_cache
          logits, step_cache = Cache.run_with_cache(self, context, {filter = filter, attention_mask = context_mask})
          steps[#steps + 1] = step_cache
        elseif context_mask then
          logits = inputs.forward(self, context, context_mask, where)
        else
          logits = self(context)                             -- (B, T, V)
        end
        last = logits:select(2, logits:size(2))
      end
      if cached then fed = ids:size(2) end
      if cached and mask then self:set_padding(nil) end
      local next_id = draw(last, opts.temperature or 1.0, opts.top_k)
      ids = torch.cat({ids, next_id:long()}, 2)
      if mask then mask = torch.cat({mask, torch.ones(mask:size(1), 1, {dtype = 'bool', device = mask.device})}, 2) end
    end
  end) end, {mode = 'eval', kv_cache = cached or nil, padding = mask and true or nil})
  ids = squeeze and ids:squeeze(1) or ids
  if steps then return ids, steps end
  return ids
end

-- generate.sample(corpus, model, prompt, opts) -> the prompt and its continuation, as text
function generate.sample(self, model, prompt, opts)
  local ids = self:encode(prompt or '')
  if ids:numel() == 0 then ids = torch.tensor({1}, {dtype = 'int64'}) end
  local out = model:generate(ids, opts)
  return self:decode(out)
end

-- m:generate(ids, {max_new = 200, temperature = 1.0, top_k, seed, kv_cache,
-- return_cache}) -> the prompt ids followed by sampled ones (and, with
-- return_cache, each step's activations), for a module from ids (B, T) to
-- logits (B, T, V); a stateful model runs as an RNN
function nn.Module:generate(ids, opts)
  local out, steps = generate.generate(self, ids, opts)
  return out, steps
end

-- corpus:sample(model, prompt, opts) -> the prompt and its continuation, as
-- text (model:generate's options)
function data.Corpus:sample(model, prompt, opts)
  local text = generate.sample(self, model, prompt, opts)
  return text
end

return generate
