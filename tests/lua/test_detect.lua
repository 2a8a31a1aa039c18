-- probe.detect_heads: on heads made to attend exactly where a kind of head
-- does, that kind scores 1 and the others what the pattern gives them; on a
-- trained model's own patterns, the scores equal a computation written here
-- query by query; padding is left out; bad kinds are errors.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, close, raises = H.test, H.eq, H.close, H.raises

local V, T = 20, 16
torch.manual_seed(2)
local model = models.gpt{vocab = V, dim = 32, heads = 4, layers = 2, seq = T, ffn = 64, norm = 'pre'}
model:eval()
local r = torch.randint(1, V + 1, {3, 6})
local ids = torch.cat({r, r, r:narrow(2, 1, 4)}, 2)  -- (3, 16): a run of 6, again, then its first 4

-- the pattern of layer `layer`, head 1, replaced by one that attends to key(q) (or to q itself where it gives none)
local function force(layer, key)
  return probe.replace(model, ('blocks.%d.attn.pattern'):format(layer), function(p)
    local out = p:clone()
    local forced = torch.zeros(p:size(1), T, T)
    for b = 1, p:size(1) do
      for q = 1, T do forced[b][q][key(b, q) or q] = 1 end
    end
    out:select(2, 1):copy_(forced)
    return out
  end)
end

test('a head made to attend to p - 1 scores 1 as a previous-token head; an induction-made head scores 1 as induction', function()
  local h1 = force(1, function(_, q) return q > 1 and q - 1 or nil end)
  local h2 = force(2, function(b, q)  -- the token after the latest earlier copy of token q, before q
    local best
    for j = 1, q - 2 do if ids[b][j]:item() == ids[b][q]:item() then best = j + 1 end end
    return best
  end)
  -- forced on purpose: inside probe.with, which removes them on return
  local s, mul = probe.with({h1, h2}, function()
    return probe.detect_heads(model, ids, {'previous_token', 'induction', 'duplicate_token'}, {measure = 'targeted'}),
      probe.detect_heads(model, ids, 'previous_token')
  end)
  eq(#probe.list(model), 0, 'probe.with removed the forced patterns')
  close(s.previous_token.scores[1][1], 1, 1e-6, 'layer 1 head 1, previous token')
  -- TransformerLens's mul divides by every query's attention: the first query has no previous token
  close(mul.scores[1][1], (T - 1) / T, 1e-6, "layer 1 head 1, previous token, TransformerLens's mul")
  close(s.induction.scores[2][1], 1, 1e-6, 'layer 2 head 1, induction')
  eq(s.previous_token:top(1)[1].name, 'blocks.1 head 1')
  eq(s.induction:heads(0.9)[1].name, 'blocks.2 head 1')
  eq(#s.induction:heads(0.9), 1)
  if not tostring(s.induction):find('the token after an earlier copy of its own', 1, true) then error(tostring(s.induction)) end
  if not s.induction:svg():find('data-kind="heatmap"', 1, true) then error('no heatmap') end
end)

test('on the model\'s own patterns, each score is the mean over queries of the attention on their targets, computed here', function()
  local s = probe.detect_heads(model, ids, {'previous_token', 'duplicate_token', 'induction'}, {measure = 'targeted'})
  local _, cache = probe.run_with_cache(model, ids, {filter = '*.pattern'})
  local rows = ids:tolist()
  for _, kind in ipairs{'previous_token', 'duplicate_token', 'induction'} do
    for l = 1, 2 do
      local p = cache:heads('pattern', l)
      for h = 1, 4 do
        local sum, n = 0, 0
        for b = 1, 3 do
          for q = 1, T do
            local keys = {}
            for k = 1, q - 1 do
              if kind == 'previous_token' and k == q - 1 then keys[#keys + 1] = k end
              if kind == 'duplicate_token' and rows[b][k] == rows[b][q] then keys[#keys + 1] = k end
              if kind == 'induction' and k >= 2 and rows[b][k - 1] == rows[b][q] then keys[#keys + 1] = k end
            end
            if #keys > 0 then
              n = n + 1
              for _, k in ipairs(keys) do sum = sum + p[h][b][q][k]:item() end
            end
          end
        end
        close(s[kind].scores[l][h], sum / n, 1e-6, ('%s layer %d head %d'):format(kind, l, h))
        eq(s[kind].queries, n, kind)
      end
    end
  end
end)

test("TransformerLens's mul: each sequence's attention on the targets over all its attention, then the mean over sequences", function()
  local s = probe.detect_heads(model, ids, {'previous_token', 'duplicate_token', 'induction'},
    {exclude_current_token = false})
  local bos = probe.detect_heads(model, ids, 'duplicate_token', {exclude_bos = true, exclude_current_token = true})
  local _, cache = probe.run_with_cache(model, ids, {filter = '*.pattern'})
  local rows = ids:tolist()
  for _, kind in ipairs{'previous_token', 'duplicate_token', 'induction', 'excluded'} do
    for l = 1, 2 do
      local p = cache:heads('pattern', l):double()
      for h = 1, 4 do
        local mean = 0
        for b = 1, 3 do
          local on, all = 0, 0
          for q = 1, T do
            for k = 1, q do
              local w = p[h][b][q][k]:item()
              local target = (kind == 'previous_token' and k == q - 1)
                or ((kind == 'duplicate_token' or kind == 'excluded') and k < q and rows[b][k] == rows[b][q])
                or (kind == 'induction' and k >= 2 and rows[b][k - 1] == rows[b][q])  -- k = q too
              if kind == 'excluded' and (k == 1 or k == q) then w = 0 end
              all = all + w
              if target then on = on + w end
            end
          end
          mean = mean + on / all / 3
        end
        local got = kind == 'excluded' and bos.scores[l][h] or s[kind].scores[l][h]
        close(got, mean, 1e-9, ('%s layer %d head %d'):format(kind, l, h))
      end
    end
  end
  -- the chance levels: the head on shuffled tokens, and a head attending evenly
  local shuffled = s.induction.shuffled
  eq(#shuffled, 2)
  assert(tostring(s.induction):find('a head attending evenly to every key it may see scores', 1, true), tostring(s.induction))
  assert(s.induction.uniform > 0 and s.induction.uniform < 0.2, 'even attention: ' .. s.induction.uniform)
  eq(probe.detect_heads(model, ids, 'induction', {baseline = false}).shuffled, nil)
end)

test('a forced induction head keeps its score on shuffled tokens only where it attends by position', function()
  -- attend to the key after the earlier copy of the query's token, found in the tokens the model reads
  local seen
  local h0 = probe.replace(model, 'embed', function(y, _, x) seen = x:tolist(); return y end)
  local h2 = probe.replace(model, 'blocks.2.attn.pattern', function(p)
    local out = p:clone()
    local forced = torch.zeros(p:size(1), T, T)
    for b = 1, p:size(1) do
      for q = 1, T do
        local best
        for j = 1, q - 2 do if seen[b][j] == seen[b][q] then best = j + 1 end end
        forced[b][q][best or q] = 1
      end
    end
    out:select(2, 1):copy_(forced)
    return out
  end)
  local s = probe.with({h0, h2}, function() return probe.detect_heads(model, ids, 'induction', {measure = 'targeted'}) end)
  close(s.scores[2][1], 1, 1e-6, 'the forced head on the input')
  assert(s.shuffled[2][1] < 0.5, ('on shuffled tokens its keys move with the tokens: %.3f'):format(s.shuffled[2][1]))
end)

test('a padded batch: each example counts its real queries and keys only', function()
  local a, b = ids[1]:narrow(1, 1, 12), ids[2]
  local mul = probe.detect_heads(model, {a, b}, 'duplicate_token', {padding_side = 'left'})
  local mul_one, mul_two = probe.detect_heads(model, a, 'duplicate_token'), probe.detect_heads(model, b, 'duplicate_token')
  for l = 1, 2 do
    for h = 1, 4 do
      close(mul.scores[l][h], (mul_one.scores[l][h] + mul_two.scores[l][h]) / 2, 1e-5, ('mul: layer %d head %d'):format(l, h))
    end
  end
  local padded = probe.detect_heads(model, {a, b}, 'duplicate_token', {padding_side = 'left', measure = 'targeted'})
  local one = probe.detect_heads(model, a, 'duplicate_token', {measure = 'targeted'})
  local two = probe.detect_heads(model, b, 'duplicate_token', {measure = 'targeted'})
  eq(padded.queries, one.queries + two.queries)
  for l = 1, 2 do
    for h = 1, 4 do
      local want = (one.scores[l][h] * one.queries + two.scores[l][h] * two.queries) / padded.queries
      close(padded.scores[l][h], want, 1e-5, ('layer %d head %d'):format(l, h))
    end
  end
end)

test('bad kinds and inputs are errors', function()
  raises(function() probe.detect_heads(model, ids, 'inductoin') end,
    'probe.detect_heads: kind must be one of previous_token, duplicate_token, induction, got inductoin')
  raises(function() probe.detect_heads(model, torch.tensor({{1, 2, 3}}, {dtype = 'int64'}), 'induction') end,
    'probe.detect_heads: no query in the input has a key the induction pattern names (the input is too short, or no token repeats)')
  raises(function() probe.detect_heads(model, ids, 'induction', {tokenzier = 1}) end,
    "probe.detect_heads: unknown option 'tokenzier', did you mean 'tokenizer'? (expected baseline, exclude_bos, exclude_current_token, measure, padding_side, seed, tokenizer)")
  raises(function() probe.detect_heads(model, ids, 'induction', {measure = 'abs'}) end,
    "probe.detect_heads: measure must be 'mul' (TransformerLens's) or 'targeted', got abs")
  raises(function() probe.detect_heads(model, ids, 'induction', {exclude_bos = 1}) end,
    'probe.detect_heads: exclude_bos must be true or false, got 1')
  -- with a list of kinds too, an error names the caller's line
  local ok, err = pcall(function() probe.detect_heads(model, torch.tensor({{1, 2, 3}}, {dtype = 'int64'}), {'previous_token', 'induction'}) end)
  if ok or not tostring(err):find('^[^\n]*test_detect%.lua:%d+: probe%.detect_heads: no query') then error('wrong position: ' .. tostring(err)) end
  local s = probe.detect_heads(model, ids, 'induction')
  raises(function() s:top(0) end, 'scores:top: k must be a positive whole number, got 0')
end)

H.done()
