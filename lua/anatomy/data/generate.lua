-- Sampling from language models: generate(model, ids, opts) for any module
-- that maps token ids (B, T) to logits (B, T, V) (model:generate in
-- nn/Module.lua), and sample(corpus, model, prompt, opts) for text in and
-- text out (corpus:sample in data.lua).
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

-- generate.generate(model, ids, {max_new = 200, temperature = 1.0, top_k = nil, seed = nil})
-- ids: (B, T) or (T) int64 prompt; returns the prompt followed by max_new
-- sampled tokens. The context is cropped to the model's seq (its position
-- table). temperature = 0 picks the most likely token.
function generate.generate(self, ids, opts)
  opts = opts or {}
  local squeeze = ids:dim() == 1
  if squeeze then ids = ids:unsqueeze(1) end
  -- the prompt goes where the model is (a corpus encodes on the CPU)
  if ids.device ~= self:device() then ids = ids:to(self:device()) end
  if opts.seed then torch.manual_seed(opts.seed) end
  local seq = self:context() or ids:size(2)
  local was_training = self.training
  self:eval()
  local stateful = rawget(self, 'step') ~= nil or self.step ~= nil
  local state
  torch.no_grad(function()
    for _ = 1, opts.max_new or 200 do
      local context = ids:size(2) > seq and ids:narrow(2, ids:size(2) - seq + 1, seq) or ids
      local last
      if stateful then
        last, state = self:step(context, state)
      else
        local logits = self(context)                       -- (B, T, V)
        last = logits:select(2, logits:size(2))
      end
      local next_id = draw(last, opts.temperature or 1.0, opts.top_k)
      ids = torch.cat({ids, next_id:long()}, 2)
    end
  end)
  self:train(was_training)
  return squeeze and ids:squeeze(1) or ids
end

-- generate.sample(corpus, model, prompt, opts) -> the prompt and its continuation, as text
function generate.sample(self, model, prompt, opts)
  local ids = self:encode(prompt or '')
  if ids:numel() == 0 then ids = torch.tensor({1}, {dtype = 'int64'}) end
  local out = model:generate(ids, opts)
  return self:decode(out)
end

return generate
