-- Causal tools on a GPT-2 checkpoint: does it copy from context (induction),
-- with which heads, through which connections? The same tools as
-- examples/circuits.lua, on a model that learnt from natural text rather
-- than from a task built to need the circuit.
-- Without --model, a GPT-2 (Hugging Face's GPT2LMHeadModel layout:
-- models.from_config{model_type = 'gpt2', ...}) is trained here on Tiny
-- Shakespeare, character by character, written with save_pretrained, and
-- read back with models.from_pretrained: that checkpoint is the one
-- measured. In a share of its training sequences (--repeats, default 1:
-- all) a span of the text at the start comes again right after itself, as
-- quotations, refrains and repeated names do in longer documents: a small
-- char-level model trained on plain Tiny Shakespeare for the README's
-- budget does not learn to copy from context (3000 steps: with
-- --repeats=0 the second copy of a repeated held-out span costs more than
-- the first; with --repeats=0.5 only 2% less, and no head attends as an
-- induction head), so the tools would have no circuit to find. The
-- measurements are on held-out text, repeated once. --model=NAME_OR_FOLDER measures a published one instead (its own
-- tokenizer, on the same held-out text).
--   1. in-context copying: on a span of held-out text repeated once (r r),
--      the loss on the second copy against the first;
--   2. induction and previous-token scores of every head (attention from p
--      to the token after p's earlier occurrence, and to p - 1);
--   3. exact patching of each head's output (attn.z) from r r into a run
--      whose first copy has every other token replaced, and its AtP
--      estimate: the same heads, in the same order?
--   4. edge attribution (EAP-IG): where do the previous-token heads write?
--   5. generation with the cache: the model continues a repeated run, and
--      with its induction heads ablated at every step it does not;
--   6. the autopsy of Shakespeare lines of different lengths, one padded batch.
--   anatomy examples/causal_pretrained.lua [--model=NAME_OR_FOLDER] [--steps=3000] [--smoke=true] [--out=out/causal_pretrained]
local cfg = experiment.config({model = '', data = '', steps = 3000, layers = 4, dim = 128, heads = 4, seq = 128, batch = 32,
  lr = 2e-3, warmup = 100, seed = 1, repeats = 1, run = 24, eval_batch = 32, out = 'out/causal_pretrained'},
  {steps = 20, layers = 2, dim = 32, seq = 64, eval_batch = 4, run = 8, warmup = 2}, arg)
local fs = require('anatomy.io.fs')
if type(cfg.repeats) ~= 'number' or cfg.repeats ~= cfg.repeats or cfg.repeats < 0 or cfg.repeats > 1 then
  error(('--repeats must be a share in [0, 1], got %s'):format(tostring(cfg.repeats)), 0)
end

-- The corpus, with a span at the start of the first share·B rows of each
-- training batch repeated right after itself (r r, then the text that
-- followed r): the rows stay text of the corpus, the targets the next token.
local function with_repeats(c, share)
  if share == 0 then return c end
  local w = {}
  function w:batch(B, T, opts)
    local x, y = c:batch(B, T, opts)
    if opts and opts.split == 'val' then return x, y end  -- the validation loss stays the plain text's
    local z = torch.cat({x, y:narrow(2, T, 1)}, 2)  -- (B, T + 1): each row's tokens
    for b = 1, math.floor(B * share) do
      local n = math.random(8, math.floor(T / 3))
      local row = z[b]:clone()
      z[b]:copy_(torch.cat({row:narrow(1, 1, n), row:narrow(1, 1, n), row:narrow(1, n + 1, T + 1 - 2 * n)}, 1))
    end
    return z:narrow(2, 1, T):contiguous(), z:narrow(2, 2, T):contiguous()
  end
  return setmetatable(w, {__index = c})
end

-- the checkpoint
local corpus, data_ = experiment.corpus(cfg)
local model, tok, trained
if cfg.model ~= '' then
  model, tok = models.from_pretrained(cfg.model)
  if not tok then  -- a checkpoint without tokenizer files: the corpus's own, when the vocabularies agree
    if model.config.vocab ~= corpus.vocab_size then
      error(('%s has no tokenizer and %d tokens; the corpus reads %d'):format(cfg.model, model.config.vocab, corpus.vocab_size), 0)
    end
    tok = corpus
  end
else
  local fresh = models.from_config({model_type = 'gpt2', vocab_size = corpus.vocab_size, n_positions = cfg.seq, n_embd = cfg.dim,
    n_layer = cfg.layers, n_head = cfg.heads}, {seed = cfg.seed})
  print(('training a GPT-2 of %s parameters on %s, %d steps, %.0f%% of the sequences with a repeated span'):format(
    nn.format_count(fresh:num_parameters()), data_.name, cfg.steps, 100 * cfg.repeats))
  trained = train.fit(fresh, with_repeats(corpus, cfg.repeats), {steps = cfg.steps, batch = cfg.batch, lr = cfg.lr, warmup = cfg.warmup, seq = cfg.seq,
    seed = cfg.seed, eval_every = math.max(1, math.floor(cfg.steps / 5))})
  fs.mkdir(cfg.out)
  fresh:save_pretrained(cfg.out .. '/checkpoint')
  model, tok = models.from_pretrained(cfg.out .. '/checkpoint'), corpus
end
model:eval()
local V, T, n = model.config.vocab, math.min(model:context(), cfg.seq), cfg.run
local layers = model:layers()
local r = experiment.results(('Induction in a GPT-2 checkpoint (%s)'):format(cfg.model ~= '' and cfg.model or
  ('%d layers, dim %d, trained here on %s, %.0f%% of its sequences with a repeated span'):format(cfg.layers, cfg.dim, data_.name,
    100 * cfg.repeats)), data_)
if trained then r:run('checkpoint', model, trained, corpus) end

-- 1. a span of held-out text repeated once (r r, then the text that followed r), from random places of the
-- validation split: in-distribution text, whose second copy a model that copies from context predicts far better
torch.manual_seed(cfg.seed + 1)
local whole = fs.read(data_.path)
local stream = cfg.model ~= '' and tok:encode(whole:sub(#whole - math.floor(#whole / 10))) or corpus:tokens('val')  -- the last tenth
local rows, rr_rows = {}, {}
for b = 1, cfg.eval_batch do
  local start = math.random(1, stream:numel() - (T + 1 - n) - 1)
  local r = stream:narrow(1, start, n)
  rows[b] = torch.cat({r, r, stream:narrow(1, start + n, T + 1 - 2 * n)}, 1)
  rr_rows[b] = r
end
local x, rr = torch.stack(rows, 1), torch.stack(rr_rows, 1)
local input = x:narrow(2, 1, T)
local logits, cache = probe.run_with_cache(model, input, {filter = {'*.pattern'}})
local function copy_loss(l, first)
  return nn.functional.cross_entropy(l:narrow(2, first, n - 1), x:narrow(2, first + 1, n - 1)):item()
end
local loss_first, loss_second = copy_loss(logits, 1), copy_loss(logits, n + 1)

-- 2. each head's induction and previous-token scores over the second copy
local heads = {}
for l, layer in ipairs(layers) do
  local p = cache:heads('pattern', l)  -- (H, B, T, T)
  for h = 1, p:size(1) do
    local ind, prev = 0, 0
    for q = n + 1, 2 * n - 1 do
      ind = ind + p[h]:select(2, q):select(2, q - n + 1):mean():item() / (n - 1)
      prev = prev + p[h]:select(2, q):select(2, q - 1):mean():item() / (n - 1)
    end
    heads[#heads + 1] = {layer = l, head = h, name = ('%s head %d'):format(layer[1], h), induction = ind, previous = prev}
  end
end
local by_induction, by_previous = {}, {}
for i, hd in ipairs(heads) do by_induction[i], by_previous[i] = hd, hd end
table.sort(by_induction, function(a, b) return a.induction > b.induction end)
table.sort(by_previous, function(a, b) return a.previous > b.previous end)
local induction, previous = {}, {}
for _, hd in ipairs(heads) do
  if hd.induction > 0.3 then induction[#induction + 1] = hd end
  if hd.previous > 0.3 and hd.induction <= 0.3 then previous[#previous + 1] = hd end
end

-- 3. exact patching and AtP on the every-other corruption, log-probability of the right token over the second copy
local broken = x:clone()
for i = 1, n, 2 do broken:narrow(2, i, 1):copy_(torch.randint(1, V + 1, {cfg.eval_batch, 1})) end
broken = broken:narrow(2, 1, T)
local targets = x:narrow(2, n + 2, n - 1):unsqueeze(3)
local function right_logprob(l) return l:narrow(2, n + 1, n - 1):log_softmax(-1):gather(3, targets):mean() end
local exact = patching.run(model, input, broken, function(l) return right_logprob(l):item() end, {over = 'attn.z', per = 'head'})
local estimated = patching.attribute(model, input, broken, right_logprob, {over = 'attn.z', per = 'head', method = 'atp'})
local ex, est = exact:normalized():tolist(), estimated:normalized():tolist()
local exact_cells, est_cells, names = {}, {}, {}
for i, hd in ipairs(heads) do
  hd.exact, hd.atp = ex[hd.layer][hd.head], est[hd.layer][hd.head]
  exact_cells[i], est_cells[i], names[i] = hd.exact, hd.atp, hd.name
end
local function ranks(v)
  local idx = {}
  for i = 1, #v do idx[i] = i end
  table.sort(idx, function(a, b) return v[a] < v[b] end)
  local out = {}
  for k, i in ipairs(idx) do out[i] = k end
  return out
end
local function spearman(a, b)
  local ra, rb = ranks(a), ranks(b)
  local m, sab, saa, sbb = (#a + 1) / 2, 0, 0, 0
  for i = 1, #a do sab, saa, sbb = sab + (ra[i] - m) * (rb[i] - m), saa + (ra[i] - m) ^ 2, sbb + (rb[i] - m) ^ 2 end
  return sab / math.sqrt(saa * sbb)
end
local function top(v, k)
  local idx = {}
  for i = 1, #v do idx[i] = i end
  table.sort(idx, function(a, b) return v[a] > v[b] end)
  local out = {}
  for i = 1, math.min(k, #idx) do out[i] = names[idx[i]] end
  table.sort(out)
  return table.concat(out, ', ')
end
local rho = spearman(exact_cells, est_cells)

-- 4. edge attribution: each previous-token head's largest edges
local graph = patching.edges(model, input, broken, right_logprob, {method = 'eap-ig', steps = 8})
local is_induction = {}
for _, hd in ipairs(induction) do is_induction[hd.name] = true end
local into_keys, edge_text = #previous > 0 and #induction > 0, {}
for _, hd in ipairs(previous) do
  local parts, k = {}, 0
  for _, e in ipairs(graph.edges) do
    if e.from == hd.name and k < 3 then
      k = k + 1
      if not (is_induction[e.to] and e.via == 'k') then into_keys = false end
      parts[#parts + 1] = ('%s (%s) %+.3f'):format(e.to, e.via or '-', e.score)
    end
  end
  edge_text[#edge_text + 1] = hd.name .. ': ' .. table.concat(parts, ', ')
end

-- 5. generation: a run shown once and half again; greedy continuation, then with the induction heads ablated at every step
local half = math.floor(n / 2)
local prompt = torch.cat({rr:narrow(1, 1, 1), rr:narrow(1, 1, 1):narrow(2, 1, half)}, 2)
local want = rr:narrow(1, 1, 1):narrow(2, half + 1, n - half)
local function copied(out)
  local got = out:narrow(2, prompt:size(2) + 1, n - half)
  return got:eq(want):double():mean():item()
end
local continued = copied(model:generate(prompt, {max_new = n - half, temperature = 0}))
local handles = {}
for _, hd in ipairs(induction) do
  handles[#handles + 1] = probe.ablate(model, patching.point(model, layers[hd.layer][1], 'attn.z'), {head = hd.head})
end
local ablated = #handles > 0 and copied(model:generate(prompt, {max_new = n - half, temperature = 0})) or nil
for _, h in ipairs(handles) do h:remove() end

-- 6. the autopsy of lines of different lengths (one padded batch)
local lines = {}
for line in whole:gmatch('[^\n]+') do
  if #line >= 20 and #lines < 16 then lines[#lines + 1] = line:sub(1, math.min(#line, T)) end
end
local a = autopsy.run(model, lines, {tokenizer = tok})
print('\n' .. tostring(a))

-- the claims
local function list(hs, key)
  local out = {}
  for i, hd in ipairs(hs) do out[i] = ('%s (%.2f)'):format(hd.name, hd[key]) end
  return #out > 0 and table.concat(out, ', ') or 'none'
end
r:add('the model copies from context: the second copy of a repeated span is far easier than the first', 'second < 0.5 x first',
  ('first %.3f, second %.3f'):format(loss_first, loss_second), loss_second < 0.5 * loss_first and 'reproduced' or 'differs')
r:add('it has induction heads (attention to the token after the earlier occurrence > 0.3), after a previous-token head\'s layer',
  'induction heads', ('%s; previous-token heads: %s'):format(list(induction, 'induction'), list(previous, 'previous')),
  #induction > 0 and #previous > 0 and induction[1].layer > previous[1].layer and 'reproduced' or 'differs')
r:add('attribution patching (AtP) ranks the heads as exact patching does: Spearman >= 0.9 and the same top three heads',
  'Spearman >= 0.9, same top 3', ('Spearman %.3f; top 3: exact %s, AtP %s'):format(rho, top(exact_cells, 3), top(est_cells, 3)),
  rho >= 0.9 and top(exact_cells, 3) == top(est_cells, 3) and 'reproduced' or 'differs')
r:add('edge attribution (EAP-IG): each previous-token head\'s three largest edges go into induction heads\' keys',
  'into induction heads via k', #edge_text > 0 and table.concat(edge_text, '; ') or 'none', into_keys and 'reproduced' or 'differs')
r:add('greedy generation continues a repeated run, and does not with the induction heads ablated at every step',
  'continues; ablated: far less', ('%.0f%% of the tokens copied; ablated: %s'):format(100 * continued,
    ablated and ('%.0f%%'):format(100 * ablated) or 'no induction heads to ablate'),
  continued >= 0.8 and ablated and ablated < 0.5 * continued and 'reproduced' or 'differs')
r:note(('Measured on %d sequences of %d tokens: a span of %d tokens of the validation split repeated once, then the text that followed it. Patching, AtP and edges: '
  .. 'the share of the way from a run whose first copy has every other token replaced back to the clean run, the metric the '
  .. 'log-probability of the right next token over the second copy. Generation: the first sequence\'s span shown once and its first %d '
  .. 'tokens again, %d greedy tokens. The autopsy: the first %d lines of %s of at least 20 characters, one padded batch.'):format(
  cfg.eval_batch, T, n, half, n - half, #lines, data_.name))
local rows = {}
for i, hd in ipairs(heads) do
  rows[i] = {hd.name, ('%.3f'):format(hd.induction), ('%.3f'):format(hd.previous), ('%.3f'):format(hd.exact), ('%.3f'):format(hd.atp)}
end
r:note('Per head: induction and previous-token scores, exact patching (share restored) and its AtP estimate:\n\n' ..
  require('anatomy.experiment.results').markdown_table({'head', 'induction', 'previous token', 'patching', 'AtP'}, rows))
print('\n' .. tostring(r))
local charts = require('anatomy.render.charts')
local Figure = require('anatomy.render.figure')
local pruned = graph:prune{top = 24}
Figure.new('Edge attribution (EAP-IG), the 24 largest edges', pruned:svg(), tostring(pruned)):save(cfg.out .. '/edges.svg')
-- the two grids on one colour scale, symmetric about 0, so that a colour means the same share in both
local extent = math.max(exact:normalized():abs():max():item(), estimated:normalized():abs():max():item())
local function share_map(title, result)
  return Figure.new(title, charts.heatmap(title, result.rows, result.cols, result:normalized():tolist(), false,
    {note = 'share of the way from the corrupt run (0) to the clean one (1); one colour scale for both grids', value = 'share',
      range = {-extent, extent}}), tostring(result))
end
share_map('Exact patching of attn.z per head', exact):save(cfg.out .. '/patching_exact.svg')
share_map('AtP estimate of the same grid', estimated):save(cfg.out .. '/patching_atp.svg')
a:report(cfg.out .. '/autopsy.html')
r:save(cfg.out, {config = cfg})
