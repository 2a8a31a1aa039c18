-- GPT-J (models/gptj.lua) through the library's tools: TransformerLens's
-- names resolve on its one-norm parallel block and what they hold adds up
-- (resid_post = resid_pre + attn_out + mlp_out), the rotation pairs
-- neighbouring dims (2i, 2i+1) on the first rotary_dim of each head, the
-- head's bias is in the readout, weight processing gives q, k and v the
-- biases ln_1's shift folds into and keeps the probabilities, and the autopsy
-- gives a row per layer. Numbers against transformers are
-- tests/parity/test_gptj_parity.py's.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, close = H.test, H.eq, H.close

local V = 40
local config = {model_type = 'gptj', vocab_size = V, n_embd = 32, n_layer = 3, n_head = 4, n_positions = 48, rotary_dim = 4,
  resid_pdrop = 0.1}
local function gptj()
  local m = models.from_config(config, {seed = 3})
  torch.no_grad(function()  -- norms and biases away from 1 and 0, so that a misplaced one shows
    for _, p in m:named_parameters() do
      if p:dim() == 1 then p:add_(torch.randn(p:size()) * 0.3) end
    end
  end)
  return m:eval()
end

local function param(m, name)
  for n, p in m:named_parameters() do if n == name then return p end end
  return nil
end

test("TransformerLens's names resolve on GPT-J's block, and its stream adds up", function()
  require('parallel_block').check(gptj(), V, {block = 'h', attn = 'attn', ln = 'ln_1', final = 'ln_f', rot = 'rot_k'})
end)

test('the rotation pairs dims (2i, 2i+1) of the first rotary_dim, at base 10000; the rest of each head passes', function()
  local m = gptj()
  local ids = torch.randint(1, V + 1, {2, 7})
  local _, cache = probe.run_with_cache(m, ids, {filter = {'h.2.attn.q', 'h.2.attn.rot_q'}})
  local q, got = cache['h.2.attn.q'], cache['h.2.attn.rot_q']  -- (B, T, H, D), D = 8
  local R, T = 4, 7
  -- angle of pair i at position t (from 0): t * 10000^(-2i/R)
  local pos = torch.arange(0, T):float():view(1, T, 1, 1)
  local freq = torch.tensor({1, 10000 ^ (-2 / R)}):float():view(1, 1, 1, R / 2)
  local cos, sin = (pos * freq):cos(), (pos * freq):sin()  -- (1, T, 1, R/2)
  local even = torch.stack({q:select(4, 1), q:select(4, 3)}, 4)  -- the pairs' first dims (B, T, H, R/2)
  local odd = torch.stack({q:select(4, 2), q:select(4, 4)}, 4)
  local a, b = even * cos - odd * sin, odd * cos + even * sin
  local want = torch.cat({torch.stack({a:select(4, 1), b:select(4, 1), a:select(4, 2), b:select(4, 2)}, 4), q:narrow(4, R + 1, 8 - R)}, 4)
  close(got, want, 1e-5, 'rot_q: interleaved pairs on the first 4 dims, the last 4 as q')
  -- the other pairing (i, i + R/2) would differ: the test tells them apart
  local halves = q:narrow(4, 1, R) * torch.cat({cos, cos}, 4) + torch.cat({-q:select(4, 3):unsqueeze(4), -q:select(4, 4):unsqueeze(4),
    q:select(4, 1):unsqueeze(4), q:select(4, 2):unsqueeze(4)}, 4) * torch.cat({sin, sin}, 4)
  assert((halves - got:narrow(4, 1, R)):abs():max():item() > 1e-2, 'the half-split pairing gives other numbers')
end)

test("the head's bias is in the readout, so in the logit lens", function()
  local m = gptj()
  local h = torch.randn({1, 5, 32})
  local bias = m.lm_head.bias
  assert(bias:abs():max():item() > 0.1, 'a bias that shows')
  local without = nn.functional.linear(m.ln_f(h), m:unembedding())
  close(m:readout(h), without + bias, 1e-5, 'readout = final norm, W_U, and b_U')
  close(lens.logit(m):readout(2, h), without + bias, 1e-5, 'the logit lens reads through it')
end)

test('weight processing: q, k and v gain the biases ln_1 folds into, the value biases go to the output; the probabilities stay', function()
  local m, p = gptj(), gptj()
  eq(param(m, 'h.1.attn.q.bias'), nil, 'GPT-J has no bias on q')
  eq(param(m, 'h.1.attn.o.bias'), nil, 'nor on its output')
  models.process_weights(p, {fold_ln = true, center_writing_weights = true, center_unembed = true, fold_value_biases = true})
  local ids = torch.randint(1, V + 1, {2, 8})
  close(p(ids):log_softmax(-1), m(ids):log_softmax(-1), 1e-4, 'log-probabilities processed and not')
  close(p.h[1].ln_1.weight, torch.ones({32}), 0, 'ln_1 left at weight 1')
  close(p.h[1].ln_1.bias, torch.zeros({32}), 0, 'and bias 0')
  assert(param(p, 'h.1.attn.q.bias'):abs():max():item() > 1e-3, 'q took the shift of ln_1')
  close(param(p, 'h.1.attn.v.bias'), torch.zeros({32}), 0, "v's bias folded on into the output's")
  assert(param(p, 'h.1.attn.o.bias'):abs():max():item() > 1e-3, 'the output took the value bias')
  H.raises_part(function() models.process_weights(gptj(), {fold_value_biases = true}) end, 'has no value biases')
end)

test('the autopsy of a GPT-J: a row per layer, each with its removal loss and lens loss', function()
  torch.manual_seed(4)
  require('family_tests').autopsy_rows(gptj(), V, {'h.1', 'h.2', 'h.3'}, 'transformer.h.0')
end)

test('the parameters a config implies are those its model has (pretrained.check_size counts them)', function()
  require('family_tests').parameters_implied('gptj', config, {{}, {n_inner = 48, rotary_dim = 8}})
end)

test('rotary_dim: absent is transformers\' 64; null and one that cannot rotate are refused by name', function()
  local F = require('anatomy.models.gptj')
  local json = require('anatomy.io.json')
  local wide = H.merged(config, {n_embd = 256, n_head = 2})
  wide.rotary_dim = nil
  eq(F.check(wide, 'test').rotary_dim, 64, 'absent: 64')
  H.raises_part(function() F.check(H.merged(config, {rotary_dim = json.null}), 'test') end, 'rotary_dim = null, which anatomy does not support')
  H.raises_part(function() F.check(H.merged(config, {rotary_dim = 5}), 'test') end, 'rotary_dim = 5, which anatomy does not support')
  H.raises_part(function() F.check(H.merged(config, {rotary_dim = 16}), 'test') end, 'at most the head size, 8')
  H.raises_part(function() F.check(H.merged(config, {tie_word_embeddings = true}), 'test') end, 'tie_word_embeddings = true')
end)

test("a checkpoint's causal-mask buffers (older transformers kept them) are not weights; save_pretrained reads back", function()
  local m = gptj()
  rawset(m, 'hf_config', H.merged(config, {}))  -- as from_pretrained keeps it, so that save_pretrained writes it
  local dir = H.tmpdir()
  m:save_pretrained(dir)
  local t = torch.load_safetensors(dir .. '/model.safetensors')
  eq(t['transformer.h.0.attn.q_proj.weight']:size(), {32, 32}, "Hugging Face's names")
  eq(t['lm_head.bias']:size(), {V}, "the head's bias")
  t['transformer.h.0.attn.bias'] = torch.ones({1, 1, 48, 48})
  t['transformer.h.0.attn.masked_bias'] = torch.tensor({-1e9})
  torch.save_safetensors(dir .. '/model.safetensors', t)
  local back = models.from_pretrained(dir)
  local ids = torch.randint(1, V + 1, {1, 6})
  H.identical(back(ids), m(ids), 'read back as written, the buffers passed over')
  t['transformer.h.0.attn.extra'] = torch.ones({2})
  torch.save_safetensors(dir .. '/model.safetensors', t)
  H.raises_part(function() models.from_pretrained(dir) end, 'a tensor anatomy does not place: transformer.h.0.attn.extra')
  os.execute("rm -rf '" .. dir .. "'")
end)

test("print(model) shows the interleaved rotary and says the checkpoint's dropout is not applied", function()
  local s = tostring(gptj())
  assert(s:find('rotary_dim=4 interleaved, parallel attention and MLP', 1, true), s)
  assert(s:find('interleaved', s:find('RoPEAttention', 1, true), true), 'the attention says it: ' .. s)
  assert(s:find('dropout of the checkpoint not applied (resid_pdrop=0.1)', 1, true), s)
end)

H.done()
