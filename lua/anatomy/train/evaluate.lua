-- train.evaluate: a model's mean cross-entropy on a corpus's validation
-- split, or on a text, in windows laid end to end (deterministic, drawing
-- nothing from the random generator).
local nn = require('anatomy.nn')
local parallel = require('anatomy.train.parallel')

-- Windows of seq + 1 tokens laid end to end over ids, at most `limit` of
-- them: deterministic, and drawing nothing from the random generator.
local function windows(ids, seq, limit)
  local n = math.floor((ids:numel() - 1) / seq)
  if limit then n = math.min(n, limit) end
  if n < 1 then return nil end
  local x = ids:narrow(1, 1, n * seq):view(n, seq)
  local y = ids:narrow(1, 2, n * seq):view(n, seq)
  return x, y
end

-- train.evaluate(model, corpus, {split = 'val', text = nil, seq, batches = 8, batch = 16})
-- -> {nats = mean cross-entropy per token, bits = the same in bits, tokens = count}.
-- With text, the model is judged on that text (encoded with the corpus's
-- tokenizer), such as samples from another model.
local function evaluate(model, corpus, opts)
  opts = opts or {}
  local seq = opts.seq or model:context() or 64
  local ids = opts.text and corpus:encode(opts.text) or corpus:tokens(opts.split or 'val')
  -- _world (train.fit's, data-parallel): each rank judges its share of the
  -- windows one process would, and the sums are added over the ranks
  local world = opts._world or 1
  local x, y = windows(ids, seq, (opts.batches or 8) * (opts.batch or 16) * world)
  if x and world > 1 then
    x, y = parallel.share(x, y, world)
    if x == nil then error('train.evaluate: fewer evaluation windows than ranks', 2) end
  end
  if not x then
    seq = ids:numel() - 1
    if seq < 1 then error('train.evaluate: the text has fewer than 2 tokens', 2) end
    x, y = ids:narrow(1, 1, seq):view(1, seq), ids:narrow(1, 2, seq):view(1, seq)
  end
  local was_training = model.training
  model:eval()
  local total, count = 0, 0
  torch.no_grad(function()
    local B = opts.batch or 16
    for first = 1, x:size(1), B do
      local n = math.min(B, x:size(1) - first + 1)
      local xb, yb = x:narrow(1, first, n), y:narrow(1, first, n)
      if torch.device() ~= 'cpu' then xb, yb = xb:to(torch.device()), yb:to(torch.device()) end
      local loss = nn.functional.cross_entropy((model(xb)), yb)  -- (...): the logits alone
      total = total + loss:item() * yb:numel()
      count = count + yb:numel()
    end
  end)
  model:train(was_training)
  if world > 1 then total, count = parallel.sum(total, count) end
  local nats = total / count
  return {nats = nats, bits = nats / math.log(2), tokens = count}
end

return evaluate
