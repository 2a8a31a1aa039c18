-- sae.evaluate and sae.top_activations of a sae.CLT: each layer's L0,
-- features alive and explained variance against the same numbers worked
-- out here from the MLP inputs and outputs read by hand; the CE losses
-- against the model run clean, with the CLT spliced in and with every MLP
-- zeroed; one layer's top activations are that layer's encoder on the
-- point it reads, and its page names the layer; bad arguments named.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, close, raises = H.test, H.eq, H.close, H.raises
local points = require('anatomy.probe.points')

torch.manual_seed(0)
local corpus = data.from_string(('the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs. '):rep(60))
local model = models.gpt{vocab = corpus.vocab_size, dim = 16, heads = 2, layers = 3, seq = 16, ffn = 32}
train.fit(model, corpus, {steps = 30, batch = 8, seq = 16, quiet = true})
model:eval()
local c = sae.train_clt(model, corpus, {kind = 'relu', width = 32, steps = 40, batch = 128, seq = 16, sequences = 8, quiet = true,
  warmup = 4, log_every = 10})

-- every layer's MLP input and output over the first n windows of T tokens of the val split, read by hand: (N, L, D) each
local function rows(n, T)
  local x = corpus:tokens('val'):narrow(1, 1, n * T):view(n, T):to(model:device())
  local xs, ys, hs = {}, {}, {}
  for l = 1, 3 do
    hs[#hs + 1] = probe.replace(model, points.part(model, l, 'mlp'), function(t, _, input) xs[l], ys[l] = input, t end)
  end
  local logits = torch.no_grad(function() return model(x) end)
  for _, h in ipairs(hs) do h:remove() end
  for l = 1, 3 do xs[l], ys[l] = xs[l]:reshape({-1, 16}), ys[l]:reshape({-1, 16}) end
  return torch.stack(xs, 2), torch.stack(ys, 2), logits, x
end

test("sae.evaluate of a CLT: each layer's L0, features alive and explained variance, and the loss spliced in", function()
  local e = sae.evaluate(model, c, corpus, {batches = 2, batch = 3, seq = 16})
  local X, Y, logits, x = rows(6, 16)
  eq(e.tokens, 96, 'six windows of 16')
  local f = c:encode(X)
  local recon = c:decode(f, X)
  for l = 1, 3 do
    local fl, yl = f:select(2, l), Y:select(2, l):double()
    local err = (recon:select(2, l):double() - yl):square():sum():item()
    local var = (yl - yl:mean(1)):square():sum():item()
    close(e.layers[l].explained_variance, 1 - err / var, 1e-5, 'layer ' .. l .. ' explained variance')
    close(e.layers[l].l0, fl:gt(0):double():sum(-1):mean():item(), 1e-9, 'layer ' .. l .. ' L0')
    eq(e.layers[l].alive, fl:gt(0):any(1):sum():item(), 'layer ' .. l .. ' features alive')
  end
  close(e.l0, e.layers[1].l0 + e.layers[2].l0 + e.layers[3].l0, 1e-9, 'L0 over all layers')
  local y = corpus:tokens('val'):narrow(1, 2, 96):view(6, 16):to(model:device())
  close(e.ce_clean, nn.functional.cross_entropy(logits, y):item(), 1e-5, 'the clean loss')
  local h = sae.attach(model, c)
  local spliced = torch.no_grad(function() return nn.functional.cross_entropy(model(x), y):item() end)
  h:remove()
  close(e.ce_spliced, spliced, 1e-5, 'the loss with every MLP output its reconstruction')
  eq(e.ce_zero > e.ce_clean, true, ('zeroing every MLP raises the loss: %.4f > %.4f'):format(e.ce_zero, e.ce_clean))
  close(e.ce_recovered, (e.ce_zero - e.ce_spliced) / (e.ce_zero - e.ce_clean), 1e-12, 'CE loss recovered')
  eq(tostring(e):match('^sae%.evaluate of a CLT over 96 tokens'), 'sae.evaluate of a CLT over 96 tokens', tostring(e))
  raises(function() sae.evaluate(model, c, corpus, {point = 'blocks.1.resid_post'}) end,
    "sae.evaluate: unknown option 'point' (expected batch, batches, seq, split)")
end)

test("sae.top_activations of a CLT's layer: that layer's encoder on the MLP input; its page names the layer", function()
  local top = sae.top_activations(model, c, corpus, {layer = 2, features = {1, 2, 3}, k = 4, batches = 2, batch = 3, seq = 16})
  local X = rows(6, 16)
  local f = c:encode(X):select(2, 2)  -- (N, F)
  for _, feature in ipairs{1, 2, 3} do
    local col = f:select(2, feature)
    eq(top.counts[feature], col:gt(0):sum():item(), 'feature ' .. feature .. ' fires as often')
    if #top[feature] > 0 then close(top[feature][1].value, col:max():item(), 1e-5, 'feature ' .. feature .. "'s top activation") end
  end
  eq(top.counts[1] + top.counts[2] + top.counts[3] > 0, true, 'some feature fires')
  local html = top:page(1)
  eq(html:find('layer 2 of a relu CLT, 32 features a layer', 1, true) ~= nil, true, 'the page names the layer')
  raises(function() sae.top_activations(model, c, corpus, {features = {1}}) end,
    "sae.top_activations: layer must be a whole number in 1..3 (the CLT's layers) for a sae.CLT, got nil")
  raises(function() sae.top_activations(model, c, corpus, {layer = 4, features = {1}}) end,
    "sae.top_activations: layer must be a whole number in 1..3 (the CLT's layers) for a sae.CLT, got 4")
  local s = sae.new{d_in = 16, d_sae = 8, point = 'blocks.1.resid_post'}
  raises(function() sae.top_activations(model, s, corpus, {layer = 1}) end,
    "sae.top_activations: layer is for a sae.CLT (which layer's features); an SAE has one point")
end)

test("the autopsy with a CLT: every layer's row carries that layer's numbers from sae.evaluate", function()
  local a = autopsy.run(model, corpus, {saes = {c}, batch = 4, seq = 16, metrics = {'grad_norm', 'erank'}})
  local e = sae.evaluate(model, c, corpus, {batches = 1, batch = 4, seq = 16})
  local seen = 0
  for _, r in ipairs(a.rows) do
    local l = tonumber(r.name:match('^blocks%.(%d+)$'))
    if l then
      close(r.sae_l0, e.layers[l].l0, 1e-9, r.name .. ' L0')
      close(r.sae_ev, e.layers[l].explained_variance, 1e-9, r.name .. ' explained variance')
      eq({r.sae_alive, r.sae_d_sae}, {e.layers[l].alive, 32}, r.name .. ' features alive')
      eq(r.sae_ce_recovered, nil, r.name .. ': no per-layer CE loss recovered')
      seen = seen + 1
    end
  end
  eq(seen, 3, 'a row for each layer')
  eq(a.missing.sae_ce_recovered, ("a CLT replaces every MLP at once: its CE loss recovered is the whole CLT's, %.4f, not a layer's")
    :format(e.ce_recovered), 'the whole CLT\'s CE loss recovered in the note')
  local two = sae.clt{n_layers = 2, d_model = 16, d_transcoder = 4}
  raises(function() autopsy.run(model, corpus, {saes = {two}}) end, 'autopsy.run: saes[1] is a CLT of 2 layers, and the model has 3')
end)

H.done()
