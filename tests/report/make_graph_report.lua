-- Writes g:report of an attribution graph over a 30-character prompt (a
-- random GPT-2 with a random JumpReLU CLT, a char-level corpus as the
-- tokenizer, feature links), for test_graph_report.sh to open in a browser:
--   anatomy make_graph_report.lua OUT.html   (prints the kept nodes and edges)
package.path = arg[0]:match('^(.*)/report/') .. '/lua/?.lua;' .. package.path
local H = require('harness')
local pretrained = require('anatomy.models.pretrained')
local corpus = data.from_string(('The cat sat on the mat. The dog ran to the house.\n'):rep(20))
local F = require(pretrained.families.gpt2)
torch.manual_seed(1)
local m = F.build(F.check({model_type = 'gpt2', vocab_size = corpus.vocab_size, n_positions = 32, n_embd = 16, n_layer = 4,
  n_head = 4}, 'make_graph_report'))
torch.no_grad(function() for _, p in ipairs(m:parameters()) do p:add_(torch.randn(p:size()) * 0.2) end end)
m:eval()
local c = H.randomize_transcoders(sae.clt{n_layers = 4, d_model = 16, d_transcoder = 24, kind = 'jumprelu',
  input_hook = 'mlp.hook_in', output_hook = 'mlp.hook_out'}, 16)
local g = sae.attribute(m, c, corpus:tokens('train'):narrow(1, 1, 30), {max_n_logits = 5, desired_logit_prob = 0.9})
g:report(arg[1], {tokenizer = corpus, feature_url = 'features/layer{layer}.html#f{feature}'})
local p = g:prune()
print(p.node_mask:long():sum():item(), p.edge_mask:long():sum():item())
