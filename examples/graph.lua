-- An attribution graph of a small model: the README's 6-layer GPT trained on
-- Tiny Shakespeare character by character (as examples/features.lua trains
-- it: dim 64, 2 heads, 64-character windows, 3000 steps), a cross-layer
-- transcoder (sae.train_clt, JumpReLU) standing in for its six MLPs, and
-- the graph of one prompt, a speaker's heading, whose next character is the
-- newline that ends it:
--   1. the CLT: each layer's L0, features alive and explained variance of
--      its MLP output; the loss with every MLP replaced (CE loss recovered);
--      spliced in with its error terms, the logits are the clean ones;
--   2. the graph (sae.attribute on the text), pruned as circuit-tracer
--      prunes it, its replacement and completeness scores;
--   3. the features most influential on the logits, each with its top
--      contexts over the validation text and a page (feature_L<l>_<f>.html);
--   4. the graph's files (circuit-tracer's, for its server and Neuronpedia)
--      and its HTML report, each feature there linked to its page.
--   anatomy --threads=1 examples/graph.lua [--steps=3000] [--clt_steps=2000] [--smoke=true] [--out=out/graph]
local cfg = experiment.config({data = '', dim = 64, heads = 2, layers = 6, ffn = 128, norm = 'pre', seq = 64, steps = 3000, batch = 32,
  lr = 3e-3, warmup = 50, seed = 1337, kind = 'jumprelu', width = 256, l0 = 1e-2, clt_steps = 2000, clt_batch = 512,
  clt_lr = 1e-3, eval_batches = 16, prompt = 'Is he come?\n\nKATHARINA:', top = 6, out = 'out/graph'},
  {steps = 30, clt_steps = 30, clt_batch = 128, width = 32, eval_batches = 2, top = 2}, arg)
local fs = require('anatomy.io.fs')
local md = require('anatomy.experiment.results').markdown_table

local corpus, data_ = experiment.corpus(cfg)
torch.manual_seed(cfg.seed)
local model = models.gpt{vocab = corpus.vocab_size, dim = cfg.dim, heads = cfg.heads, layers = cfg.layers, ffn = cfg.ffn, seq = cfg.seq,
  norm = cfg.norm}
print(('a GPT of %s parameters on %s, %d steps'):format(nn.format_count(model:num_parameters()), data_.name, cfg.steps))
local run = train.fit(model, corpus, {steps = cfg.steps, batch = cfg.batch, seq = cfg.seq, lr = cfg.lr, warmup = cfg.warmup,
  seed = cfg.seed, eval_every = math.max(1, math.floor(cfg.steps / 5))})
model:eval()

-- 1. the CLT and how much of the MLPs it keeps
print(('\na %s CLT, %d features a layer, on the %d MLPs'):format(cfg.kind, cfg.width, cfg.layers))
local clock = os.clock()
local c, history = sae.train_clt(model, corpus, {kind = cfg.kind, width = cfg.width, l0 = cfg.l0, steps = cfg.clt_steps,
  batch = cfg.clt_batch, lr = cfg.clt_lr, seq = cfg.seq, seed = cfg.seed})
local clt_seconds = os.clock() - clock
local e = sae.evaluate(model, c, corpus, {batches = cfg.eval_batches, batch = 16, seq = cfg.seq})
print('\n' .. tostring(e))
fs.mkdir(cfg.out)
c:save(cfg.out .. '/clt')
local x = corpus:tokens('val'):narrow(1, 1, 8 * cfg.seq):view(8, cfg.seq):to(model:device())
local clean = torch.no_grad(function() return model(x) end)
local h = sae.attach(model, c, {error_term = true})
local spliced = torch.no_grad(function() return model(x) end)
h:remove()
local same = torch.equal(spliced, clean)

-- 2. the graph of the prompt, pruned and scored
local show = function(s) return (s:gsub('\n', '\\n')) end
clock = os.clock()
local g = sae.attribute(model, c, corpus:encode(cfg.prompt))  -- a char corpus puts no BOS first: its first character is left out
local graph_seconds = os.clock() - clock
print(('\n%s of "%s"'):format(tostring(g), show(cfg.prompt)))
local pruned = g:prune()
local replacement, completeness = g:scores()
local n = g.selected_features:size(1)
local N, K, T, L = g.adjacency_matrix:size(1), g.logit_tokens:size(1), g.n_pos, g.n_layers
local edges = g.adjacency_matrix:ne(0):sum():item()
local kept_nodes, kept_edges = pruned.node_mask:sum():item(), pruned.edge_mask:sum():item()
local kept_features = pruned.node_mask:narrow(1, 1, n):sum():item()
local kept_errors = pruned.node_mask:narrow(1, n + 1, L * T):sum():item()
local logits = {}
for i = 1, K do
  logits[i] = ('`%s` %.3f'):format(show(corpus:decode({g.logit_tokens[i]:item()})), g.logit_probabilities[i]:item())
end
print(('pruned: %d of %d nodes (%d of %d features, %d error nodes), %d of %d edges; replacement %.4f, completeness %.4f')
  :format(kept_nodes, N, kept_features, n, kept_errors, kept_edges, edges, replacement, completeness))

-- 3. the features most influential on the logits: each node's share of the influence is the step its
-- cumulative score takes over the next more influential node's
local cum = pruned.cumulative_scores
local sorted, order = cum:sort(1)
local share, previous = {}, 0
for i = 1, N do
  share[order[i]:item()] = sorted[i]:item() - previous
  previous = sorted[i]:item()
end
local top = {}
for i = 1, N do
  local node = order[i]:item()
  if node <= n then top[#top + 1] = node end
  if #top == cfg.top then break end
end
local by_layer = {}
for _, node in ipairs(top) do
  local row = g.active_features[g.selected_features[node]:item()]
  local l, f = row[1]:item(), row[3]:item()
  by_layer[l] = by_layer[l] or {}
  table.insert(by_layer[l], f)
end
local scans = {}
for l, fs_ in pairs(by_layer) do
  scans[l] = sae.top_activations(model, c, corpus, {layer = l, features = fs_, k = 12, context = 24, seq = cfg.seq})
  print('\n' .. tostring(scans[l]))
end
local feature_rows, pages = {}, {}
for i, node in ipairs(top) do
  local a = g.selected_features[node]:item()
  local row = g.active_features[a]
  local l, p, f = row[1]:item(), row[2]:item(), row[3]:item()
  local scan = scans[l]
  local best = scan[f][1]
  local name = ('feature_L%d_%d.html'):format(l, f)
  scan:save(f, cfg.out .. '/' .. name)
  pages[l .. ':' .. f] = name
  feature_rows[i] = {tostring(l), tostring(f), ('%d `%s`'):format(p, show(corpus:decode({g.input_tokens[p]:item()}))),
    ('%.3f'):format(g.activation_values[a]:item()), ('%.4f'):format(share[node]),
    ('%.2f%%'):format(100 * scan.counts[f] / scan.tokens),
    best and ('`%s[%s]%s`'):format(show(best.before), show(best.token), show(best.after)) or '-'}
end

-- 4. the graph's files and its report, the features with a page linked to it
g:json(cfg.out .. '/graph_files', {slug = 'katharina', scan = 'anatomy-example-gpt-clt', tokenizer = corpus})
g:report(cfg.out .. '/graph.html', {tokenizer = corpus, title = ('"%s" through a %s CLT'):format(show(cfg.prompt), cfg.kind),
  feature_url = function(l, f) return pages[l .. ':' .. f] or '' end})

-- the claims
local r = experiment.results(('An attribution graph of a 6-layer GPT (dim %d, trained here on %s) through a cross-layer transcoder')
  :format(cfg.dim, data_.name), data_)
r:run('model', model, run, corpus)
local worst = math.huge
for _, row in ipairs(e.layers) do worst = math.min(worst, row.explained_variance or -math.huge) end
r:add('a CLT in place of every MLP explains most of each MLP\'s output', 'EV >= 0.8 at every layer',
  ('EV %.4f pooled, %.4f at the worst layer; L0 %.1f features a token over all layers'):format(e.explained_variance, worst, e.l0),
  worst >= 0.8 and 'reproduced' or 'differs')
r:add('with every MLP replaced by the CLT\'s reconstruction, most of the loss that zeroing them costs is recovered',
  'CE loss recovered >= 0.9', e.ce_recovered and ('%.4f (clean %.4f, spliced %.4f, every MLP zeroed %.4f nats)'):format(
    e.ce_recovered, e.ce_clean, e.ce_spliced, e.ce_zero) or e.notes[#e.notes], e.ce_recovered and e.ce_recovered >= 0.9
    and 'reproduced' or 'differs')
r:add('spliced in with its error terms, the model\'s logits are the clean ones bit for bit', 'identical',
  same and 'identical' or ('differ by up to %.3g'):format((spliced - clean):abs():max():item()), same and 'reproduced' or 'differs')
local first = corpus:decode({g.logit_tokens[1]:item()})
r:add(('after the heading "%s" the model predicts the newline that ends it'):format(show(cfg.prompt)), 'top logit `\\n`',
  ('`%s` at %.3f'):format(show(first), g.logit_probabilities[1]:item()), first == '\n' and 'reproduced' or 'differs')
r:add('most of the graph\'s influence on the logits runs through features and tokens rather than error nodes',
  'replacement >= 0.5, completeness >= 0.8', ('replacement %.4f, completeness %.4f'):format(replacement, completeness),
  replacement >= 0.5 and completeness >= 0.8 and 'reproduced' or 'differs')
local per_layer = {}
for l, row in ipairs(e.layers) do
  per_layer[l] = {tostring(l), ('%.2f'):format(row.l0), ('%d of %d'):format(row.alive, cfg.width),
    row.explained_variance and ('%.4f'):format(row.explained_variance) or 'n/a'}
end
local t = c.cfg.trained
r:note(('CLT: %s, %d features a layer (%d in all), cross-layer (each layer\'s features write to its own MLP output and every later '
  .. 'one), reading ln2.hook_normalized and writing hook_mlp_out (circuit-tracer\'s defaults); %d steps of %d rows (%d-character '
  .. 'windows), Adam at lr %g, sparsity coefficient l0 %g; trained in %.0f s of CPU time, saved in circuit-tracer\'s format in clt/. '
  .. 'Measured on the first %d windows of the validation split (%d tokens):\n\n%s'):format(cfg.kind, cfg.width, cfg.width * cfg.layers,
  t.steps, t.batch, t.seq, t.lr, cfg.l0, clt_seconds, e.tokens / cfg.seq, e.tokens,
  md({'layer', 'L0', 'features alive', 'explained variance of its MLP output'}, per_layer)))
r:note(('The graph of "%s" (%d characters; the first, a newline, is the position circuit-tracer leaves out): %d active features, '
  .. '%d error nodes, %d token nodes, %d logits (%s), %d nodes and %d nonzero edges, built in %.1f s of CPU time. Pruned as '
  .. 'circuit-tracer prunes (node threshold 0.8, edge threshold 0.98): %d nodes (%d features, %d error nodes) and %d edges. '
  .. 'Files: graph_files/ (circuit-tracer\'s graph files), graph.html (the report; the features above link to their pages).'):format(show(cfg.prompt), T, n, L * T, T, K,
  table.concat(logits, ', '), N, edges, graph_seconds, kept_nodes, kept_features, kept_errors, kept_edges))
r:note('The features most influential on the logits (influence: the node\'s share of the graph\'s total influence, circuit-tracer\'s '
  .. 'node influence), where each is active in the prompt, its density over the validation text and the context where it fires '
  .. 'hardest there, its token in brackets; each has a page, feature_L<layer>_<feature>.html:\n\n'
  .. md({'layer', 'feature', 'position', 'activation', 'influence', 'density', 'top context'}, feature_rows))
local rows = {}
for i, step in ipairs(history.step) do
  rows[i] = {tostring(step), ('%.4f'):format(history.loss[i]), ('%.1f'):format(history.l0[i]),
    ('%.3f'):format(history.explained_variance[i]), ('%.1f%%'):format(100 * history.dead[i])}
end
r:note('The CLT\'s training (on each logged step\'s batch: L0, features active a token in a layer, averaged over the layers; the '
  .. 'explained variance of all layers\' MLP outputs):\n\n'
  .. md({'step', 'loss', 'L0', 'explained variance', 'dead'}, rows))
print('\n' .. tostring(r))
r:save(cfg.out, {config = cfg})
