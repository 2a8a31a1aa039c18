-- Circuits: induction heads. A two-layer transformer (models.llama: rotary
-- positions, so position is relative, as in the models where induction
-- heads were found) trained on sequences in which
-- a run of random tokens repeats once (r r, then random filler) can only
-- predict the second copy by finding the earlier occurrence of the current
-- token and reading the token after it: the induction circuit (Olsson et
-- al., "In-context learning and induction heads", 2022). The run's length
-- varies from sequence to sequence, so no fixed positional offset does the
-- job: a first-layer head attends to the previous token and a second-layer
-- head composes with it (the previous-token head tells it where to look). With the tools of probe and patching,
-- four views of the trained model should point at the same heads:
--   1. run_with_cache: a head's attention from position p to p - n + 1
--      (the token after the previous occurrence), its induction score; and
--      to p - 1, its previous-token score;
--   2. per-head zero ablation: the loss on the repeated copy rises most
--      without those heads;
--   3. activation patching of each head's output (attn.z) from a clean run
--      (r r) into a corrupted one (r' r): those heads restore the logit of
--      the right next token;
--   4. direct logit attribution: their outputs push that logit up;
--   5. path patching from the previous-token heads into the induction heads:
--      their clean output restores the right logit through the induction
--      heads' keys (K-composition), far more than through queries or values;
--   6. attribution patching (AtP) estimates a per-head patching grid from
--      one backward: its ranking of the heads matches the exact one;
--   7. edge attribution (EAP-IG) scores every connection between heads: the
--      previous-token heads' strongest edges go into the induction heads' keys;
--   8. a linear probe per layer (probe.linear) for the previous token: at
--      chance on the embedding, near 1 after the previous-token heads;
--   9. the library's head detectors (probe.detect_heads) find the heads the
--      scores of 1. found;
--  10. composition scores from the weights alone (weights.composition): the
--      previous-token heads' output is read by the induction heads' keys more
--      than by their queries or values.
--   anatomy examples/circuits.lua [--steps=1500] [--smoke=true] [--out=out/circuits]
local native = require('anatomy.torch.native')
local cfg = experiment.config({vocab = 64, seq = 48, min_run = 8, max_run = 20, eval_run = 16, dim = 256, heads = 4, layers = 2,
  ffn = 128, steps = 1500, batch = 32, lr = 3e-3, seed = 3, eval_batch = 64, probe_batch = 512, probe_steps = 1000, probe_lr = 0.05,
  out = 'out/circuits'},
  {steps = 30, eval_batch = 8, probe_batch = 8, probe_steps = 20, seq = 24, min_run = 4, max_run = 10, eval_run = 8, dim = 32, ffn = 64}, arg)

torch.manual_seed(cfg.seed)
local V, T = cfg.vocab, cfg.seq
local model = models.llama{vocab = V, dim = cfg.dim, heads = cfg.heads, layers = cfg.layers, ffn = cfg.ffn, seq = T}
print(('%s parameters; %d-token sequences: a run of %d..%d random tokens (of %d), the same run again, random filler'):format(
  nn.format_count(model:num_parameters()), T, cfg.min_run, cfg.max_run, V))

-- (B, T + 1): r r filler, with r of n random tokens
local function repeated(B, n)
  local r = torch.randint(1, V + 1, {B, n})
  return torch.cat({r, r, torch.randint(1, V + 1, {B, T + 1 - 2 * n})}, 2)
end

-- The loss on the second copy: input positions n+1 .. 2n-1 predict tokens n+2 .. 2n.
local function repeated_loss(logits, x, n)
  return nn.functional.cross_entropy(logits:narrow(2, n + 1, n - 1), x:narrow(2, n + 2, n - 1))
end

local opt = optim.AdamW(model, {lr = cfg.lr, weight_decay = 0})
local t0 = native.now()
for step = 1, cfg.steps do
  local n = math.random(cfg.min_run, cfg.max_run)
  local x = repeated(cfg.batch, n)
  local logits = model(x:narrow(2, 1, T))
  local loss = nn.functional.cross_entropy(logits, x:narrow(2, 2, T))
  opt:zero_grad()
  loss:backward()
  opt:step()
  if step % math.max(1, math.floor(cfg.steps / 10)) == 0 or step == cfg.steps then
    print(('step %4d  loss %.3f  (second copy, run of %d: %.3f)'):format(step, loss:item(), n, repeated_loss(logits, x, n):item()))
  end
end
model:eval()
print(('trained in %.0f s'):format(native.now() - t0))

torch.manual_seed(cfg.seed + 1)
local n = cfg.eval_run
local x = repeated(cfg.eval_batch, n)
local input = x:narrow(2, 1, T)
local logits, cache = probe.run_with_cache(model, input, {filter = {'*.pattern'}})
local base_loss = repeated_loss(logits, x, n):item()

-- 1. induction score: mean attention from p to p - n + 1 over the second copy; previous-token score: to p - 1
local heads = {}
for l = 1, cfg.layers do
  local p = cache:heads('pattern', l)  -- (H, B, T, T)
  for h = 1, cfg.heads do
    local ind, prev, count = 0, 0, 0
    for q = n + 1, 2 * n - 1 do
      ind = ind + p[h]:select(2, q):select(2, q - n + 1):mean():item()
      prev = prev + p[h]:select(2, q):select(2, q - 1):mean():item()
      count = count + 1
    end
    heads[#heads + 1] = {layer = l, head = h, name = ('blocks.%d head %d'):format(l, h), induction = ind / count, previous = prev / count}
  end
end

-- the library's detectors (probe.detect_heads) on the same sequences, every query that has a target (measure =
-- 'targeted'; TransformerLens's 'mul' would divide by the first copy's queries too, which have none): the same heads?
local detected = probe.detect_heads(model, input, {'previous_token', 'induction'}, {measure = 'targeted', baseline = false})
print('\n' .. tostring(detected.previous_token) .. '\n' .. tostring(detected.induction))
local function names_of(list)
  local out = {}
  for i, hd in ipairs(list) do out[i] = hd.name end
  table.sort(out)
  return table.concat(out, ', ')
end

-- 2. per-head zero ablation of z: the loss on the repeated half
for _, hd in ipairs(heads) do
  local handle = probe.ablate(model, ('blocks.%d.self_attn.z'):format(hd.layer), {head = hd.head})
  local out = torch.no_grad(function() return model(input) end)
  handle:remove()
  hd.ablated_loss = repeated_loss(out, x, n):item()
end

-- 3. patching attn.z per head from r r into r' r; metric: mean logit of the right next token on the second copy
local corrupt = x:clone()
corrupt:narrow(2, 1, n):copy_(torch.randint(1, V + 1, {cfg.eval_batch, n}))
local targets = x:narrow(2, n + 2, n - 1):unsqueeze(3)
local function right_logit(l)
  return l:narrow(2, n + 1, n - 1):gather(3, targets):mean():item()
end
local patched = patching.run(model, input, corrupt:narrow(2, 1, T), right_logit, {over = 'attn.z', per = 'head'})
print('\n' .. tostring(patched))
local normalized = patched:normalized():tolist()
for _, hd in ipairs(heads) do hd.patching = normalized[hd.layer][hd.head] end

-- 4. direct logit attribution of the right next token at the last position of the second copy, over sequences
local n_dla = math.min(cfg.eval_batch, 16)
local dla = {}
for b = 1, n_dla do
  local r = probe.logit_attribution(model, input:narrow(1, b, 1), x[b][2 * n]:item(), {position = 2 * n - 1})
  for _, row in ipairs(r.rows) do dla[row[1]] = (dla[row[1]] or 0) + row[2] / n_dla end
  if b == 1 then print('\n' .. tostring(r)) end
end
for _, hd in ipairs(heads) do hd.dla = dla[('blocks.%d.self_attn head %d'):format(hd.layer, hd.head)] end

-- the table, and which heads each view picks
local lines = {('\n%-18s %10s %14s %14s %10s %8s'):format('head', 'induction', 'previous token', 'loss ablated', 'patching', 'DLA')}
for _, hd in ipairs(heads) do
  lines[#lines + 1] = ('%-18s %10.3f %14.3f %14.3f %10.3f %8.3f'):format(hd.name, hd.induction, hd.previous, hd.ablated_loss,
    hd.patching, hd.dla)
end
print(table.concat(lines, '\n'))
print(('loss on the second copy (run of %d) with every head: %.3f (chance: %.3f)'):format(n, base_loss, math.log(V)))

-- The circuit: induction heads (score > 0.3) and previous-token heads (score > 0.3).
local induction, previous, others_i, outside = {}, {}, {}, {}
for _, hd in ipairs(heads) do
  hd.is_induction, hd.is_previous = hd.induction > 0.3, hd.previous > 0.3
  if hd.is_induction then induction[#induction + 1] = hd else others_i[#others_i + 1] = hd end
  if hd.is_previous then previous[#previous + 1] = hd end
  if not hd.is_induction and not hd.is_previous then outside[#outside + 1] = hd end
end
local function list(hs, key)
  local out = {}
  for i, hd in ipairs(hs) do out[i] = key and ('%s (%.2f)'):format(hd.name, hd[key]) or hd.name end
  return #out > 0 and table.concat(out, ', ') or 'none'
end
local function extreme(hs, key, most)  -- the smallest (largest) value of key over hs; NaN for none (every comparison false)
  if #hs == 0 then return 0 / 0 end
  local v = hs[1][key]
  for _, hd in ipairs(hs) do v = most and math.max(v, hd[key]) or math.min(v, hd[key]) end
  return v
end
local all_in = function(hs, layer) for _, hd in ipairs(hs) do if hd.layer ~= layer then return false end end return #hs > 0 end
local circuit = {}
for _, hd in ipairs(induction) do circuit[#circuit + 1] = hd end
for _, hd in ipairs(previous) do if not hd.is_induction then circuit[#circuit + 1] = hd end end
-- every induction head ablated at once: where one alone costs little, the others may be doing its work
local together_loss = 0 / 0
if #induction > 0 then
  local handles = {}
  for _, hd in ipairs(induction) do handles[#handles + 1] = probe.ablate(model, ('blocks.%d.self_attn.z'):format(hd.layer), {head = hd.head}) end
  local out = torch.no_grad(function() return model(input) end)
  for _, hnd in ipairs(handles) do hnd:remove() end
  together_loss = repeated_loss(out, x, n):item()
end

-- 5. path patching: the previous-token heads' clean output into the induction
-- heads only, through their queries, keys or values (everything else frozen
-- at the corrupt run): K-composition is the path through k. The corruption
-- here breaks what the previous-token heads say and nothing else the
-- induction heads need: every other token of the first copy is replaced
-- (positions 1, 3, 5, ...), so the token after each replaced one is still
-- there to be copied, but its key no longer says which token preceded it.
local paths = {}
local broken = x:clone()
for i = 1, n, 2 do broken:narrow(2, i, 1):copy_(torch.randint(1, V + 1, {cfg.eval_batch, 1})) end
broken = broken:narrow(2, 1, T)
if #previous > 0 and #induction > 0 then
  local senders, receivers = {}, {}
  for i, hd in ipairs(previous) do senders[i] = {hd.layer, hd.head} end
  for i, hd in ipairs(induction) do receivers[i] = {hd.layer, hd.head} end
  for _, via in ipairs{'q', 'k', 'v'} do
    local p = patching.path(model, input, broken, right_logit, {sender = senders, receivers = receivers, via = via})
    paths[via] = p:normalized()
    print(p)
  end
end

-- 6. attribution patching against exact patching, per head of attn.z. On the
-- corruption of 5 (every other first-copy token replaced) every head of the
-- circuit has something to restore: the previous-token heads (the keys) as
-- well as the induction heads. The r' r corruption of 3 leaves the
-- previous-token heads nothing to restore, so five of the eight heads sit
-- within a few thousandths of zero and their order is noise; both are
-- reported. The metric is the log-probability of the right next token (as a
-- tensor, for its gradient).
local function right_logprob(l) return l:narrow(2, n + 1, n - 1):log_softmax(-1):gather(3, targets):mean() end
local function right_logit_tensor(l) return l:narrow(2, n + 1, n - 1):gather(3, targets):mean() end
local exact = patching.run(model, input, broken, function(l) return right_logprob(l):item() end, {over = 'attn.z', per = 'head'})
local estimated = patching.attribute(model, input, broken, right_logprob, {over = 'attn.z', per = 'head', method = 'atp'})
local estimated_rr = patching.attribute(model, input, corrupt:narrow(2, 1, T), right_logit_tensor, {over = 'attn.z', per = 'head', method = 'atp'})
print('\n' .. tostring(exact))
print('\n' .. tostring(estimated))
-- the induction heads' keys (layer 2): exact patching, AtP, and AtP with AtP*'s QK fix (the pattern recomputed
-- from the clean key, then linear): where each estimate lands against the exact share
local key_exact = patching.run(model, input, broken, function(l) return right_logprob(l):item() end,
  {over = 'attn.k', per = 'head', layers = 2}):normalized():tolist()[1]
local key_atp = patching.attribute(model, input, broken, right_logprob, {over = 'attn.k', per = 'head', layers = 2}):normalized():tolist()[1]
local key_qk = patching.attribute(model, input, broken, right_logprob,
  {over = 'attn.k', per = 'head', layers = 2, method = 'atp-qk'}):normalized():tolist()[1]

-- 7. edge attribution on the same corruption and metric: every edge from the
-- embedding, a head or an MLP into a head's q, k or v, an MLP or the logits
local graph = patching.edges(model, input, broken, right_logprob, {method = 'eap-ig', steps = 8})
local linear = patching.edges(model, input, broken, right_logprob)
print('\n' .. tostring(graph:prune{top = 20}))

-- Spearman's rank correlation of two lists (ranks by value, ties averaged)
local function ranks(v)
  local idx = {}
  for i = 1, #v do idx[i] = i end
  table.sort(idx, function(a, b) return v[a] < v[b] end)
  local r, i = {}, 1
  while i <= #idx do
    local j = i
    while j < #idx and v[idx[j + 1]] == v[idx[i]] do j = j + 1 end
    for k = i, j do r[idx[k]] = (i + j) / 2 end
    i = j + 1
  end
  return r
end
local function spearman(a, b)
  local ra, rb = ranks(a), ranks(b)
  local n, ma, mb = #a, 0, 0
  for i = 1, n do ma, mb = ma + ra[i] / n, mb + rb[i] / n end
  local sab, saa, sbb = 0, 0, 0
  for i = 1, n do sab, saa, sbb = sab + (ra[i] - ma) * (rb[i] - mb), saa + (ra[i] - ma) ^ 2, sbb + (rb[i] - mb) ^ 2 end
  return sab / math.sqrt(saa * sbb)
end
local exact_cells, estimated_cells, rr_exact, rr_estimated, head_names = {}, {}, {}, {}, {}
local ex, est, est_rr = exact:normalized():tolist(), estimated:normalized():tolist(), estimated_rr:normalized():tolist()
for _, hd in ipairs(heads) do
  hd.exact, hd.atp, hd.atp_rr = ex[hd.layer][hd.head], est[hd.layer][hd.head], est_rr[hd.layer][hd.head]
  exact_cells[#exact_cells + 1], estimated_cells[#estimated_cells + 1] = hd.exact, hd.atp
  rr_exact[#rr_exact + 1], rr_estimated[#rr_estimated + 1] = hd.patching, hd.atp_rr
  head_names[#head_names + 1] = hd.name
end
local function top3(v)
  local idx = {}
  for i = 1, #v do idx[i] = i end
  table.sort(idx, function(a, b) return v[a] > v[b] end)
  local out = {}
  for i = 1, math.min(3, #idx) do out[i] = head_names[idx[i]] end
  table.sort(out)
  return table.concat(out, ', ')
end
local rho, rho_rr = spearman(exact_cells, estimated_cells), spearman(rr_exact, rr_estimated)
-- AtP's size against exact patching's, over the circuit's heads: the order can be right and the size not
-- (a ratio to a share near zero says nothing: only the heads that restore at least 0.05 of the way)
local low, high = 0 / 0, 0 / 0
for _, hd in ipairs(circuit) do
  if math.abs(hd.exact) >= 0.05 then
    local ratio = hd.atp / hd.exact
    low = low == low and math.min(low, ratio) or ratio
    high = high == high and math.max(high, ratio) or ratio
  end
end
-- 7's claim: each previous-token head's three largest edges (by |score|) go into induction heads' keys
local function node(hd) return ('blocks.%d head %d'):format(hd.layer, hd.head) end
local is_induction = {}
for _, hd in ipairs(induction) do is_induction[node(hd)] = true end
local function largest_edges(g, from, k)
  local out = {}
  for _, e in ipairs(g.edges) do if e.from == from and #out < k then out[#out + 1] = e end end
  return out
end
local k_composition, edge_text = #previous > 0 and #induction > 0, {}
for _, hd in ipairs(previous) do
  local parts = {}
  for _, e in ipairs(largest_edges(graph, node(hd), 3)) do
    if not (is_induction[e.to] and e.via == 'k') then k_composition = false end
    parts[#parts + 1] = ('%s (%s) %+.3f [EAP %+.3f]'):format(e.to:gsub('^blocks%.', ''), e.via or '-', e.score, linear:score(e.from, e.to, e.via))
  end
  edge_text[#edge_text + 1] = node(hd) .. ': ' .. table.concat(parts, ', ')
end

-- 8. a linear probe for the previous token at every layer (the same sequences; every position but the
-- first), with a control task: the embedding cannot know it (rotary positions, random tokens), the
-- residual stream after the previous-token heads' layer can
local probe_input = repeated(cfg.probe_batch, n):narrow(2, 1, T)  -- fresh sequences: 64 classes need more than eval_batch
local prev_labels = torch.ones(cfg.probe_batch, T, {dtype = 'int64'})
prev_labels:narrow(2, 2, T - 1):copy_(probe_input:narrow(2, 1, T - 1))
local labelled = torch.ones(cfg.probe_batch, T, {dtype = 'bool'})
labelled:narrow(2, 1, 1):fill_(false)
local probes = probe.linear(model, probe_input, prev_labels, {mask = labelled, control = true, seed = cfg.seed, steps = cfg.probe_steps,
  lr = cfg.probe_lr})
print('\n' .. tostring(probes))
local after_previous = true  -- every row from the previous-token heads' layer on
local first_previous = math.huge
for _, hd in ipairs(previous) do first_previous = math.min(first_previous, hd.layer) end
local probe_text = {}
for _, row in ipairs(probes.rows) do
  if row.layer >= first_previous and row.test_acc < 0.95 then after_previous = false end
  probe_text[#probe_text + 1] = ('%s %.3f (control %.3f)'):format(row.name, row.test_acc, row.control_acc)
end

-- 10. composition scores (weights alone): each mode's mean over the pairs previous-token head -> induction
-- head, against the mean over every other pair of a layer-1 head and a layer-2 head
local comp = weights.composition(model, {'q', 'k', 'v'})
print('\n' .. tostring(comp.k))
local comp_pairs, comp_rest = {}, {}
for _, mode in ipairs({'q', 'k', 'v'}) do
  local s, on, n_on, off, n_off = comp[mode].scores, 0, 0, 0, 0
  for ha = 1, cfg.heads do
    for hb = 1, cfg.heads do
      local v, circuit_pair = s[1][ha][2][hb]:item(), false
      for _, p in ipairs(previous) do
        for _, i in ipairs(induction) do circuit_pair = circuit_pair or (p.layer == 1 and p.head == ha and i.layer == 2 and i.head == hb) end
      end
      if circuit_pair then on, n_on = on + v, n_on + 1 else off, n_off = off + v, n_off + 1 end
    end
  end
  comp_pairs[mode], comp_rest[mode] = n_on > 0 and on / n_on or 0 / 0, n_off > 0 and off / n_off or 0 / 0
end

-- '%.3f' of a value, or 'none' where the set of heads it came from is empty
local function shown(f, v) return v ~= v and 'none' or f:format(v) end

local r = experiment.results('Induction heads in a 2-layer transformer on repeated random tokens', nil)
r:add('the second copy is predictable once the circuit forms (loss far under chance)', ('chance %.2f'):format(math.log(V)), base_loss,
  base_loss < 0.5 * math.log(V) and 'reproduced' or 'differs')
r:add('induction heads (attention to the token after the earlier copy > 0.3) are in layer 2', 'layer 2', list(induction, 'induction'),
  all_in(induction, 2) and 'reproduced' or 'differs')
r:add('previous-token heads (attention to p - 1 > 0.3) are in layer 1', 'layer 1', list(previous, 'previous'),
  all_in(previous, 1) and 'reproduced' or 'differs')
r:add('ablating any head of the circuit costs more than ablating any head outside it (loss on the second copy)',
  ('base %.3f'):format(base_loss), ('circuit >= %s, others <= %s'):format(shown('%.3f', extreme(circuit, 'ablated_loss')), shown('%.3f', extreme(outside, 'ablated_loss', true))),
  #circuit > 0 and extreme(circuit, 'ablated_loss') > extreme(outside, 'ablated_loss', true) and 'reproduced' or 'differs')
r:add('patching an induction head\'s output restores more of the right logit than any head outside the circuit', 'the induction heads',
  ('induction >= %s, others <= %s'):format(shown('%.2f', extreme(induction, 'patching')), shown('%.2f', extreme(outside, 'patching', true))),
  #induction > 0 and extreme(induction, 'patching') > extreme(outside, 'patching', true) and 'reproduced' or 'differs')
r:add('the induction heads write the right logit directly more than any other head', 'the induction heads',
  ('induction >= %s, others <= %s'):format(shown('%+.2f', extreme(induction, 'dla')), shown('%+.2f', extreme(others_i, 'dla', true))),
  #induction > 0 and extreme(induction, 'dla') > extreme(others_i, 'dla', true) and 'reproduced' or 'differs')
r:add('the previous-token heads reach the induction heads through their keys (K-composition): path patching via k restores more than via q or v',
  'via k', paths.k and ('k %.2f, q %.2f, v %.2f'):format(paths.k, paths.q, paths.v) or 'none',
  paths.k and paths.k > paths.q and paths.k > paths.v and 'reproduced' or 'differs')
r:add('attribution patching (AtP) ranks the heads as exact patching does: Spearman >= 0.9 and the same top three heads',
  'Spearman >= 0.9, same top 3', ('Spearman %.3f; top 3: exact %s, AtP %s'):format(rho, top3(exact_cells), top3(estimated_cells)),
  rho >= 0.9 and top3(exact_cells) == top3(estimated_cells) and 'reproduced' or 'differs')
r:add('edge attribution (EAP-IG) finds K-composition: each previous-token head\'s three largest edges go into induction heads\' keys',
  'into induction heads via k', #edge_text > 0 and table.concat(edge_text, '; ') or 'none', k_composition and 'reproduced' or 'differs')
local det_previous, det_induction = detected.previous_token:heads(0.3), detected.induction:heads(0.3)
r:add('probe.detect_heads (every query with a target, not only the second copy) finds the same heads (score > 0.3)',
  ('previous token: %s; induction: %s'):format(names_of(previous), names_of(induction)),
  ('previous token: %s; induction: %s'):format(names_of(det_previous), names_of(det_induction)),
  names_of(det_previous) == names_of(previous) and names_of(det_induction) == names_of(induction) and 'reproduced' or 'differs')
r:add('a linear probe for the previous token is at chance on the embedding and >= 95% accurate from the previous-token heads\' layer on',
  ('chance %.3f; >= 0.95 from layer %s'):format(probes.rows[1].chance, first_previous < math.huge and tostring(first_previous) or '-'),
  table.concat(probe_text, '; '), first_previous < math.huge and probes.rows[1].test_acc <= probes.rows[1].chance + 0.05 and after_previous
    and 'reproduced' or 'differs')
r:add('from the weights alone, the previous-token heads\' output is read by the induction heads\' keys more than by their queries or values '
  .. '(mean composition score over those pairs)', 'K > Q, K > V',
  ('K %s, Q %s, V %s (other layer-1 -> layer-2 pairs: K %s, Q %s, V %s)'):format(shown('%.3f', comp_pairs.k), shown('%.3f', comp_pairs.q),
    shown('%.3f', comp_pairs.v), shown('%.3f', comp_rest.k), shown('%.3f', comp_rest.q), shown('%.3f', comp_rest.v)),
  comp_pairs.k == comp_pairs.k and comp_pairs.k > comp_pairs.q and comp_pairs.k > comp_pairs.v and 'reproduced' or 'differs')
r:note(('Zero-ablating the %d induction heads together costs %s on the second copy (base %.3f); one of them alone costs %s to %s.')
  :format(#induction, shown('%.3f', together_loss), base_loss, shown('%.3f', extreme(induction, 'ablated_loss')),
    shown('%.3f', extreme(induction, 'ablated_loss', true))))
r:note(('The linear probes: %d fresh sequences (runs of %d), every position but the first labelled with the token before it (%d classes), '
  .. 'whole sequences split 80/20. The previous-token heads\' mean attention to p - 1: %s; the probe\'s best held-out '
  .. 'accuracy: %.3f.'):format(cfg.probe_batch, n,
  #probes.class_values, list(previous, 'previous'), (function()
    local best = 0
    for _, row in ipairs(probes.rows) do best = math.max(best, row.test_acc) end
    return best
  end)()))
r:note(('%d steps of AdamW (lr %g, batch %d) on %d-token sequences (a run of %d..%d random tokens of %d, repeated, then filler); '
  .. 'models.llama with dim %d, %d heads, ffn %d; measured on %d fresh sequences with runs of %d (DLA averaged over the first %d, '
  .. 'at the second copy\'s last input position). Patching: share of the way from the corrupt run (r\' r) to the clean one; path patching, '
  .. 'AtP and edge attribution: the same share (edges: metric units), from a run whose first copy has every other token (positions 1, 3, 5, ...) '
  .. 'replaced, with the log-probability of the right token as the metric. On the r\' r corruption (right logit) AtP against exact patching '
  .. 'has Spearman %.3f, top 3 %s vs %s (the most a previous-token head restores there: %s). '
  .. 'On the every-other corruption, AtP\'s estimate is %s to %s of the exact share over the circuit\'s heads that restore at least 0.05 '
  .. '(it is linear in each head\'s output, from the gradient at the corrupt run). '
  .. 'Edge scores in brackets: plain EAP (the gradient on the corrupt run alone).'):format(
  cfg.steps, cfg.lr, cfg.batch, T, cfg.min_run, cfg.max_run, V, cfg.dim, cfg.heads, cfg.ffn, cfg.eval_batch, n, n_dla,
  rho_rr, top3(rr_exact), top3(rr_estimated), shown('%.3f', extreme(previous, 'patching', true)), shown('%.2f', low), shown('%.2f', high)))
local per_head = {}
for i, hd in ipairs(heads) do
  per_head[i] = {hd.name, ('%.3f'):format(hd.induction), ('%.3f'):format(hd.previous), ('%.3f'):format(hd.ablated_loss),
    ('%.3f'):format(hd.patching), ('%.3f'):format(hd.atp_rr), ('%.3f'):format(hd.exact), ('%.3f'):format(hd.atp), ('%+.3f'):format(hd.dla)}
end
r:note('Per head: induction and previous-token scores (mean attention), the loss on the second copy with the head zero-ablated, '
  .. 'patching (share restored) and its AtP estimate on each corruption, direct logit attribution:\n\n' .. require('anatomy.experiment.results').markdown_table(
  {'head', 'induction', 'previous token', 'loss ablated', "patching r' r", "AtP r' r", 'patching every other', 'AtP every other', 'DLA'}, per_head))
local key_rows = {}
for h = 1, #key_exact do
  key_rows[h] = {('blocks.2 head %d'):format(h), ('%.3f'):format(key_exact[h]), ('%.3f'):format(key_atp[h]), ('%.3f'):format(key_qk[h])}
end
r:note('The induction heads\' keys (attn.k, layer 2) on the every-other corruption, share restored: exact patching, AtP, and AtP with '
  .. 'AtP*\'s QK fix (atp-qk: the pattern recomputed with the clean key, the metric linear from the pattern on):\n\n'
  .. require('anatomy.experiment.results').markdown_table({'head', 'exact', 'AtP', 'AtP with the QK fix'}, key_rows))
print('\n' .. tostring(r))
patched:report(cfg.out .. '/patching.html')
-- the two grids as shares restored (one colour scale for both, symmetric about 0, so that a colour means the
-- same share in each) and the pruned edge graph: on one page, and each as an SVG file
local page = require('anatomy.render.page')
local charts = require('anatomy.render.charts')
local Figure = require('anatomy.render.figure')
local extent = math.max(exact:normalized():abs():max():item(), estimated:normalized():abs():max():item())
local function share_map(title, result)
  local note = ('share of the way from the corrupt run (0) to the clean one (1); clean %.4g, corrupt %.4g; one colour scale '
    .. 'for both grids'):format(result.clean, result.corrupt)
  return Figure.new(title, charts.heatmap(title, result.rows, result.cols, result:normalized():tolist(), false,
    {note = note, value = 'share', range = {-extent, extent}}), tostring(result))
end
local pruned = graph:prune{top = 20}
local figures = {
  share_map('Exact patching of attn.z per head (every other first-copy token replaced)', exact),
  share_map('AtP estimate of the same grid (two forwards, one backward)', estimated),
  Figure.new('Edge attribution (EAP-IG, 8 steps), the 20 largest edges', pruned:svg(), tostring(pruned)),
  Figure.new('Linear probes for the previous token, by layer', probes:svg(), tostring(probes)),
  Figure.new('K-composition scores from the weights (weights.composition)', comp.k:svg(), tostring(comp.k)),
}
local html = {}
for i, f in ipairs(figures) do
  html[i] = f.html_figure
  f:save(cfg.out .. '/' .. ({'patching_exact.svg', 'patching_atp.svg', 'edges.svg', 'probes.svg', 'composition_k.svg'})[i])
end
require('anatomy.io.fs').write_atomic(cfg.out .. '/attribution.html', page.new('Attribution patching, edge attribution, probes and composition', table.concat(html)))
r:save(cfg.out, {config = cfg})
