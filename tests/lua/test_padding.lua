-- Batches of unequal length: padded on either side with a padding mask,
local function format_shape(t) return table.concat(t:size(), "x") end
-- each example's logits, cache entries and metrics equal its own run alone
-- (the five pretrained families and the built-in GPT); patching over a
-- padded batch is the mean of the examples'; what cannot be padded says so.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, close, raises = H.test, H.eq, H.close, H.raises

local V = 40
local function models_under_test() return H.family_models(V, 3) end

-- t's entries at example b's real positions: the position dimension (2, or
-- 3 and 4 for scores and patterns) narrowed to them
local function real_part(name, t, b, first, n)
  local x = t:narrow(1, b, 1)
  if name:match('%.scores$') or name:match('%.pattern$') then return x:narrow(3, first, n):narrow(4, first, n) end
  return x:narrow(2, first, n)
end

test('a padded batch: each example\'s logits, cache entries and metric equal its own run, both sides, every family', function()
  torch.manual_seed(5)
  local rows = {torch.randint(1, V + 1, {5}), torch.randint(1, V + 1, {8}), torch.randint(1, V + 1, {3})}
  local metric = patching.logit_diff(3, 5)
  for _, entry in ipairs(models_under_test()) do
    local name, m = entry[1], entry[2]
    m:eval()
    local worst = 0
    for _, side in ipairs{'right', 'left'} do
      local out, cache = probe.run_with_cache(m, rows, {padding_side = side})
      eq(cache.mask:size(), {3, 8}, name)
      local metrics = 0
      for b, r in ipairs(rows) do
        local alone, own = probe.run_with_cache(m, r)
        local n = r:numel()
        local first = side == 'left' and 8 - n + 1 or 1
        local d = (real_part('logits', out, b, first, n) - alone):abs():max():item()
        for _, point in ipairs(own:names()) do
          local got, want = real_part(point, cache[point], b, first, n), own[point]
          if format_shape(got) ~= format_shape(want) then error(('%s %s: %s vs %s'):format(name, point, format_shape(got), format_shape(want))) end
          local pd = (got - want):abs():masked_fill(want:isinf(), 0):max():item()
          d = math.max(d, pd)
        end
        worst = math.max(worst, d)
        metrics = metrics + metric(alone):item() / #rows
      end
      local md = math.abs(metric(out, cache.mask):item() - metrics)
      assert(md <= 1e-5, ('%s, %s padding: the metric differs by %.3g'):format(name, side, md))
      assert(worst <= 1e-5, ('%s, %s padding: an entry differs by %.3g'):format(name, side, worst))
    end
    print(('  %-36s largest difference %.3g (logits and %d cache entries, both sides)'):format(name, worst, #select(2, probe.run_with_cache(m, rows[1])):names()))
  end
end)

test('patching over a padded batch: the mean of the examples\' patching, exact and estimated', function()
  torch.manual_seed(6)
  local m = models.llama{vocab = V, dim = 32, heads = 4, layers = 2, ffn = 64, seq = 48}
  local clean = {torch.randint(1, V + 1, {6}), torch.randint(1, V + 1, {4})}
  local corrupt = {clean[1]:clone(), clean[2]:clone()}
  corrupt[1][2], corrupt[2][1] = 7, 9
  local metric = patching.logit_diff(3, 5)
  for _, side in ipairs{'right', 'left'} do
    local run = patching.run(m, clean, corrupt, metric, {over = 'resid_pre', padding_side = side})
    local atp = patching.attribute(m, clean, corrupt, metric, {over = 'attn.z', per = 'head', padding_side = side})
    local run_mean, atp_mean = torch.zeros_like(run.grid), torch.zeros_like(atp.grid)
    for b = 1, 2 do
      run_mean = run_mean + patching.run(m, clean[b], corrupt[b], metric, {over = 'resid_pre'}).grid / 2
      local one = patching.attribute(m, clean[b], corrupt[b], metric, {over = 'attn.z', per = 'head'})
      atp_mean = atp_mean + one.grid / 2  -- the estimated effects
    end
    close(run.grid, run_mean, 1e-5, side .. ': patching.run')
    close(atp.grid, atp_mean, 1e-5, side .. ': patching.attribute')
  end
  H.raises_part(function() patching.run(m, clean, {corrupt[1], corrupt[2]:narrow(1, 1, 3)}, metric) end,
    'patching.run: clean[2] is 4 tokens and corrupt[2] 3; each clean example must be as long as its corrupt one')
end)

test('padding is refused where it cannot be honoured, and masks are checked', function()
  local rows = {torch.randint(1, V + 1, {5}), torch.randint(1, V + 1, {3})}
  local vibe = models.vibenet{vocab = V, dim = 16, layers = 1, seq = 8}
  H.raises_part(function() probe.run_with_cache(vibe, rows) end,
    'probe.run_with_cache: a padded batch (examples of different lengths), but models.VibeNet does not declare')
  local m = models.gpt{vocab = V, dim = 16, heads = 2, layers = 1, seq = 8, ffn = 32, norm = 'pre'}
  local ids = torch.randint(1, V + 1, {2, 5})
  raises(function() probe.run_with_cache(m, ids, {attention_mask = torch.ones(2, 4)}) end,
    'probe.run_with_cache: attention_mask must be (B, T) as the ids (2x5), got 2x4')
  raises(function() probe.run_with_cache(m, rows, {padding_side = 'middle'}) end,
    "probe.run_with_cache: padding_side must be 'right' or 'left', got middle")
  local right = torch.ones(2, 5, {dtype = 'bool'})
  right[2][5] = false
  raises(function() m:generate(ids, {attention_mask = right, max_new = 2}) end,
    "generate: attention_mask pads on the right; generation needs the padding on the left (padding_side = 'left')")
  -- a bad mask is refused before any block takes it
  raises(function() m:set_padding('x') end, 'set_padding: mask must be (B, T) bool or int64, or nil, got string')
  raises(function() probe.forward(m, ids, torch.ones(3)) end, 'probe.forward: attention_mask must be (B, T) as the ids (2x5), got 3')
  -- an all-true mask is no padding; after a padded run the model runs unpadded as before
  local a = torch.no_grad(function() return m(ids) end)
  probe.run_with_cache(m, rows)
  H.identical(torch.no_grad(function() return m(ids) end), a, 'no mask left behind')
end)

test('generation from prompts of different lengths (left padding), with and without the cache, equals each prompt alone', function()
  torch.manual_seed(7)
  for _, entry in ipairs(models_under_test()) do
    local name, m = entry[1], entry[2]
    m:eval()
    local rows = {torch.randint(1, V + 1, {4}), torch.randint(1, V + 1, {7})}
    local ids, _, mask = probe.to_ids(m, rows, {padding_side = 'left'})
    local both = m:generate(ids, {max_new = 8, temperature = 0, attention_mask = mask})
    H.identical(m:generate(ids, {max_new = 8, temperature = 0, attention_mask = mask, kv_cache = false}), both, name .. ': cached or not')
    for b, r in ipairs(rows) do
      local alone = m:generate(r, {max_new = 8, temperature = 0})
      H.identical(both[b]:narrow(1, 7 - r:numel() + 1, r:numel() + 8), alone, ('%s: prompt %d'):format(name, b))
    end
  end
end)

test('train.evaluate on texts of different lengths: the same as judging each alone, weighted by its tokens', function()
  torch.manual_seed(8)
  local path = os.tmpname()
  local f = io.open(path, 'w')
  f:write(('to be or not to be, that is the question. '):rep(20))
  f:close()
  local corpus = data.text(path)
  os.remove(path)
  local m = models.gpt{vocab = corpus.vocab_size, dim = 32, heads = 4, layers = 2, seq = 48, ffn = 64, norm = 'pre'}
  local texts = {'to be or not', 'that is the question.', 'be'}
  local r = train.evaluate(m, corpus, {texts = texts, batch = 2})
  local total, count = 0, 0
  for _, t in ipairs(texts) do
    local one = train.evaluate(m, corpus, {text = t})
    total, count = total + one.nats * one.tokens, count + one.tokens
  end
  eq(r.tokens, count, 'every next token, no padding')
  close(r.nats, total / count, 1e-5, 'the token-weighted mean of each alone')
  raises(function() train.evaluate(m, corpus, {texts = {'to be', 'q'}}) end, 'train.evaluate: texts[2] has fewer than 2 tokens')
  raises(function() train.evaluate(m, corpus, {txt = 'to be'}) end, "train.evaluate: unknown option 'txt', did you mean 'text'? (expected batch, batches, seq, split, text, texts)")
end)

test('the autopsy of texts of different lengths: every column from the real positions alone', function()
  torch.manual_seed(9)
  for _, entry in ipairs({models_under_test()[2], models_under_test()[1], models_under_test()[6]}) do
    local name, m = entry[1], entry[2]
    m:eval()
    local rows = {torch.randint(1, V + 1, {9}), torch.randint(1, V + 1, {5}), torch.randint(1, V + 1, {12})}
    local a = autopsy.run(m, rows)
    local layer = a.rows[2].name
    -- the same numbers from each example alone, pooled over their positions
    local ce, removed, n, outs, entropy_sum, queries, heads = 0, 0, 0, {}, nil, 0, nil
    for _, r in ipairs(rows) do
      local x, y = r:narrow(1, 1, r:numel() - 1):unsqueeze(1), r:narrow(1, 2, r:numel() - 1):unsqueeze(1)
      local logits, cache = probe.run_with_cache(m, x, {filter = {layer, layer .. '.*.pattern'}})
      local k = y:numel()
      ce = ce + nn.functional.cross_entropy(logits, y):item() * k
      local h = probe.skip(m, layer)
      removed = removed + torch.no_grad(function() return nn.functional.cross_entropy(m(x), y):item() end) * k
      h:remove()
      n = n + k
      outs[#outs + 1] = cache[layer][1]
      for _, point in ipairs(cache:names()) do
        if point:match('%.pattern$') then
          local p = cache[point]:double()
          local e = -(p * p:log()):masked_fill(p:le(0), 0):sum(4):sum(3)[1]  -- (H): summed over the queries
          entropy_sum = entropy_sum and entropy_sum + e or e
          queries = queries + p:size(3)
        end
      end
    end
    local all = torch.cat(outs, 1):double()
    local std = ((all - all:mean()):pow(2):mean()):sqrt():item()
    close(a.loss, ce / n, 1e-5, name .. ': the loss, every real next token')
    close(a.rows[2].act_std, std, 1e-5, name .. ': act_std over the real positions')
    close(a.rows[2].removal_loss, removed / n, 1e-5, name .. ': removal_loss')
    close(a.rows[2].entropy, (entropy_sum / queries):mean():item(), 1e-5, name .. ': attention entropy over the real queries')
    print(('  %-36s loss %.6f, act_std %.6f, removal %.6f: as each example alone'):format(name, a.loss, a.rows[2].act_std, a.rows[2].removal_loss))
  end
  local m = models.gpt{vocab = V, dim = 16, heads = 2, layers = 1, seq = 8, ffn = 32, norm = 'pre'}
  raises(function() autopsy.run(m, {torch.randint(1, V + 1, {4}), torch.randint(1, V + 1, {1})}) end,
    'autopsy.run: data[2] has 1 token(s): nothing to predict')
  raises(function() autopsy.run(m, {torch.randint(1, V + 1, {4}), torch.randint(1, V + 1, {3})}, {steps = 2}) end,
    'autopsy.run: a list of texts is one batch; steps must be 1, got 2')
  raises(function() autopsy.run(m, {'some text'}) end,
    'autopsy.run: texts need a tokenizer: pass {tokenizer = tok}, or use a model from models.from_pretrained')
  raises(function() autopsy.run(m, {torch.randint(1, V + 1, {2, 8}), torch.randint(1, V + 1, {2, 8})}, {step = 2}) end,
    "autopsy.run: unknown option 'step', did you mean 'steps'? (expected batch, config, history, k, lens, metrics, probe_text, saes, seq, steps, thresholds, tokenizer)")
end)

H.done()
