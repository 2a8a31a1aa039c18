-- Writes an autopsy report of a small model trained for a few steps with
-- probes, and a comparison of it with a 2-layer one, for test_report.sh to
-- open in a browser:  anatomy make_report.lua OUT.html COMPARE.html
local out = arg[1]
torch.manual_seed(0)
local corpus = data.from_string(('It was the best of times, it was the worst of times, it was the age of wisdom. '):rep(60))
local model = models.gpt{vocab = corpus.vocab_size, dim = 32, heads = 2, layers = 3, seq = 32, ffn = 64}
local run = train.fit(model, corpus, {steps = 40, batch = 8, quiet = true, probe = {every = 10}})
local a = autopsy.run(model, corpus, {history = run, batch = 4})
a:report(out)
torch.manual_seed(0)
local small = models.gpt{vocab = corpus.vocab_size, dim = 32, heads = 2, layers = 2, seq = 32, ffn = 64}
local small_run = train.fit(small, corpus, {steps = 40, batch = 8, quiet = true})
autopsy.compare({{'3 layers', a}, {'2 layers', autopsy.run(small, corpus, {history = small_run, batch = 4})}}):report(arg[2])
-- the charts the report must have, one per line, for the test to count
local expected = {'Loss during training', 'Gradient norm of each parameter over training', 'act_std of each layer over training',
  'grad_norm per row', 'erank per layer', 'erank of each weight matrix', 'entropy per layer', 'entropy: layer x head',
  'act_std per layer', 'lens_loss', 'removal_loss'}
-- and every head's attention map with its tokens: 3 layers x 2 heads
for l = 1, 3 do for h = 1, 2 do expected[#expected + 1] = ('blocks.%d head %d'):format(l, h) end end
print(#expected)
