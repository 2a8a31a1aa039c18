-- train.evaluate: a model's mean cross-entropy on a corpus's validation
-- split, or on a text, in windows laid end to end (deterministic, drawing
-- nothing from the random generator).
local torch = require('anatomy.torch')
local nn = require('anatomy.nn')
local parallel = require('anatomy.train.parallel')
local inputs = require('anatomy.probe.inputs')
local scope = require('anatomy.probe.scope')
local options = require('anatomy.torch.options')

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

-- texts of any lengths, each at most the model's context: the summed
-- cross-entropy of every real next-token prediction and their count, in
-- padded batches whose padding no real position reads and no loss counts.
local function evaluate_texts(model, corpus, texts, seq, B, where)
  if type(texts) ~= 'table' or #texts == 0 then error(('%s: texts must be a list of texts'):format(where), 0) end
  local rows = {}
  for i, t in ipairs(texts) do
    if type(t) ~= 'string' then error(('%s: texts[%d] is a %s, not a string'):format(where, i, type(t)), 0) end
    rows[i] = corpus:encode(t)
    if rows[i]:numel() < 2 then error(('%s: texts[%d] has fewer than 2 tokens'):format(where, i), 0) end
    if rows[i]:numel() - 1 > seq then
      error(('%s: texts[%d] is %d tokens; the model reads %d at a time: judge it alone with {text = ...}'):format(
        where, i, rows[i]:numel(), seq), 0)
    end
  end
  local total, count = 0, 0
  for first = 1, #rows, B do
    local xs, ys = {}, {}
    for i = first, math.min(first + B - 1, #rows) do
      local r = rows[i]
      xs[#xs + 1], ys[#ys + 1] = r:narrow(1, 1, r:numel() - 1), r:narrow(1, 2, r:numel() - 1)
    end
    local x, _, mask = inputs.to_ids(model, xs, nil, where)
    local y = inputs.to_ids(model, ys, nil, where)  -- both on the model's device
    local logits = inputs.forward(model, x, mask and mask:to(x.device), where)
    local nll = -logits:log_softmax(-1):gather(3, y:unsqueeze(3)):squeeze(3)  -- (B, T)
    if mask then nll = nll:masked_fill(mask:to(x.device):logical_not(), 0) end
    total = total + nll:double():sum():item()
    count = count + (mask and mask:sum():item() or y:numel())
  end
  return total, count
end

-- train.evaluate(model, corpus, {split = 'val', text = nil, texts = nil,
-- seq, batches = 8, batch = 16}) -> {nats = mean cross-entropy per token,
-- bits = the same in bits, tokens = count}.
-- With text, the model is judged on that text (encoded with the corpus's
-- tokenizer), such as samples from another model. With texts, a list of
-- texts of any lengths (each within the model's context), on every next
-- token of each: batched with padding that no loss counts, the same as
-- judging each alone and weighting by its tokens.
local function evaluate(model, corpus, opts)
  local hooks = require('anatomy.probe.hooks')
  hooks.require_clean(model, 'train.evaluate', 2)
  opts = options.check(opts, {'split', 'text', 'texts', 'seq', 'batches', 'batch', '_world'}, 'train.evaluate', 2)
  if opts.text ~= nil and opts.texts ~= nil then error('train.evaluate: give text or texts, not both', 2) end
  -- counts checked when given: a batch of 0 stepped the loop below by 0 (it
  -- never ended), and a window limit of 0 judged the whole text as one window
  local given_seq = options.whole(opts.seq, 'seq', 'train.evaluate', nil)
  local batches = options.whole(opts.batches, 'batches', 'train.evaluate', 8)
  local B = options.whole(opts.batch, 'batch', 'train.evaluate', 16)
  if opts.texts ~= nil then
    local total, count = scope.run(model, function()
      return torch.no_grad(function()
        return evaluate_texts(model, corpus, opts.texts, given_seq or model:context() or math.huge, B, 'train.evaluate')
      end)
    end, {mode = 'eval'})
    local nats = total / count
    return {nats = nats, bits = nats / math.log(2), tokens = count}
  end
  local seq = given_seq or model:context() or 64
  local ids = opts.text and corpus:encode(opts.text) or corpus:tokens(opts.split or 'val')
  -- _world (train.fit's, data-parallel): each rank judges its share of the
  -- windows one process would, and the sums are added over the ranks
  local world = opts._world or 1
  local x, y = windows(ids, seq, batches * B * world)
  if x and world > 1 then
    x, y = parallel.share(x, y, world)
    if x == nil then error('train.evaluate: fewer evaluation windows than ranks', 2) end
  end
  if not x then
    seq = ids:numel() - 1
    if seq < 1 then error('train.evaluate: the text has fewer than 2 tokens', 2) end
    x, y = ids:narrow(1, 1, seq):view(1, seq), ids:narrow(1, 2, seq):view(1, seq)
  end
  local total, count = 0, 0
  local device = model:device()  -- the corpus's windows are on the CPU
  scope.run(model, function() torch.no_grad(function()
    for first = 1, x:size(1), B do
      local n = math.min(B, x:size(1) - first + 1)
      local xb, yb = x:narrow(1, first, n), y:narrow(1, first, n)
      xb, yb = xb:to(device), yb:to(device)
      local loss = nn.functional.cross_entropy((model(xb)), yb)  -- (...): the logits alone
      total = total + loss:item() * yb:numel()
      count = count + yb:numel()
    end
  end) end, {mode = 'eval'})  -- the modes as they were after, an error included
  if world > 1 then total, count = parallel.sum(total, count) end
  local nats = total / count
  return {nats = nats, bits = nats / math.log(2), tokens = count}
end

require('anatomy.probe.hooks').analysis(evaluate)

return evaluate
