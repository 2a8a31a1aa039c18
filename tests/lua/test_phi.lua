-- Phi (models/phi.lua) through the library's tools: TransformerLens's names
-- resolve on its one-norm parallel block and what they hold adds up (resid_post
-- = resid_pre + attn_out + mlp_out, no resid_mid and no ln2), the head's bias
-- is in the readout (logit lens), weight processing keeps the probabilities,
-- and the autopsy gives a row per layer. Numbers against transformers are
-- tests/parity/test_phi_parity.py's.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, close = H.test, H.eq, H.close

local V = 40
local config = {model_type = 'phi', vocab_size = V, hidden_size = 32, intermediate_size = 64, num_hidden_layers = 3,
  num_attention_heads = 4, max_position_embeddings = 48, partial_rotary_factor = 0.5, resid_pdrop = 0.1}
local function phi()
  local m = models.from_config(config, {seed = 3})
  torch.no_grad(function()  -- norms and biases away from 1 and 0, so that a misplaced one shows
    for name, p in m:named_parameters() do
      if p:dim() == 1 then p:add_(torch.randn(p:size()) * 0.3) end
    end
  end)
  return m:eval()
end

local function param(m, name)
  for n, p in m:named_parameters() do if n == name then return p end end
  error('no parameter ' .. name)
end

test("TransformerLens's names resolve on Phi's block, and its stream adds up", function()
  require('parallel_block').check(phi(), V, {block = 'blocks', attn = 'self_attn', ln = 'input_layernorm', final = 'final_layernorm', rot = 'rot_q'})
end)

test("the head's bias is in the readout, so in the logit lens", function()
  local m = phi()
  local h = torch.randn({1, 5, 32})
  local bias = m.lm_head.bias
  assert(bias:abs():max():item() > 0.1, 'a bias that shows')
  local without = nn.functional.linear(m.final_layernorm(h), m:unembedding())
  close(m:readout(h), without + bias, 1e-5, 'readout = final norm, W_U, and b_U')
  local l = lens.logit(m)
  close(l:readout(2, h), without + bias, 1e-5, 'the logit lens reads through it')
end)

test('weight processing keeps the probabilities; the one norm folds into attention and MLP', function()
  local m, p = phi(), phi()
  models.process_weights(p, {fold_ln = true, center_writing_weights = true, center_unembed = true, fold_value_biases = true})
  local ids = torch.randint(1, V + 1, {2, 8})
  close(p(ids):log_softmax(-1), m(ids):log_softmax(-1), 1e-4, 'log-probabilities processed and not')
  close(p.blocks[1].input_layernorm.weight, torch.ones({32}), 0, 'the norm left at weight 1')
  close(p.blocks[1].input_layernorm.bias, torch.zeros({32}), 0, 'and bias 0')
  local d = (param(p, 'blocks.1.mlp.fc.weight') - param(m, 'blocks.1.mlp.fc.weight')):abs():max():item()
  assert(d > 1e-3, 'the MLP took the norm: its weight moved by ' .. d)
end)

test('the autopsy of a Phi: a row per layer, each with its removal loss and lens loss', function()
  torch.manual_seed(4)
  require('family_tests').autopsy_rows(phi(), V, {'blocks.1', 'blocks.2', 'blocks.3'}, 'model.layers.0')
end)

test('the parameters a config implies are those its model has (pretrained.check_size counts them)', function()
  require('family_tests').parameters_implied('phi', config, {{}, {num_key_value_heads = 2, head_dim = 16}})
end)

test("print(model) says the checkpoint's dropout is not applied", function()
  local s = tostring(phi())
  assert(s:find('rotary_dim=4, parallel attention and MLP', 1, true), s)
  assert(s:find('dropout of the checkpoint not applied (resid_pdrop=0.1)', 1, true), s)
end)

H.done()
