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
  local m = phi()
  local tl = function(name) return probe.from_transformer_lens(m, name) end
  eq(tl('blocks.0.hook_resid_pre'), 'blocks.1.resid_pre')
  eq(tl('blocks.2.hook_resid_post'), 'blocks.3.resid_post')
  eq(tl('blocks.1.attn.hook_z'), 'blocks.2.self_attn.z')
  eq(tl('blocks.0.mlp.hook_post'), 'blocks.1.mlp.post')
  eq(tl('blocks.0.ln1.hook_normalized'), 'blocks.1.input_layernorm.normalized')
  eq(tl('blocks.0.hook_attn_out'), 'blocks.1.self_attn')
  eq(tl('ln_final.hook_normalized'), 'final_layernorm.normalized')
  H.raises_part(function() tl('blocks.0.ln2.hook_normalized') end, 'blocks.1 has no ln2')
  local listed = {}
  for _, pair in ipairs(probe.transformer_lens_names(m)) do listed[pair[1]] = pair[2] end
  eq(listed['blocks.0.hook_resid_mid'], nil, 'no stream between attention and MLP')
  eq(listed['blocks.2.attn.hook_rot_q'], 'blocks.3.self_attn.rot_q')
  local ids = torch.randint(1, V + 1, {2, 9})
  local logits, cache = probe.run_with_cache(m, ids)
  close(logits, m(ids), 1e-5, 'logits with every hook point on (each block on its explicit path)')
  local worst = 0
  for l = 0, 2 do
    local b = 'blocks.' .. l .. '.'
    local sum = cache[b .. 'hook_resid_pre'] + cache[b .. 'hook_attn_out'] + cache[b .. 'hook_mlp_out']
    worst = math.max(worst, (sum - cache[b .. 'hook_resid_post']):abs():max():item())
    -- one norm feeds both: the MLP's input is the norm's output (ln1.hook_out; hook_normalized is before its affine)
    local w, bias = param(m, ('blocks.%d.mlp.fc.weight'):format(l + 1)), param(m, ('blocks.%d.mlp.fc.bias'):format(l + 1))
    local pre = nn.functional.linear(cache[b .. 'ln1.hook_out'], w, bias)
    close(cache[b .. 'mlp.hook_pre'], pre, 1e-5, b .. 'mlp.hook_pre from ln1')
    close(cache[b .. 'mlp.hook_post'], nn.functional.gelu(pre, {approximate = 'tanh'}), 1e-5, b .. 'gelu_new')
  end
  assert(worst <= 1e-5, ('resid_post = resid_pre + attn_out + mlp_out to %.3g'):format(worst))
  print(('  resid_post against resid_pre + attn_out + mlp_out: largest difference %.3g'):format(worst))
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
  local m = phi()
  local a = autopsy.run(m, {torch.randint(1, V + 1, {2, 8}), torch.randint(1, V + 1, {2, 8})})
  local blocks = {}
  for _, r in ipairs(a.rows) do
    if r.kind == 'block' then
      blocks[#blocks + 1] = r.name
      assert(r.removal_loss == r.removal_loss and r.lens_loss == r.lens_loss, r.name .. ': removal and lens losses are numbers')
    end
  end
  eq(blocks, {'blocks.1', 'blocks.2', 'blocks.3'})
  eq(a.rows[2].hf_name, 'model.layers.0')
end)

test('the parameters a config implies are those its model has (pretrained.check_size counts them)', function()
  local F = require('anatomy.models.phi')
  for _, extra in ipairs{{}, {num_key_value_heads = 2, head_dim = 16}} do
    local m = models.from_config(H.merged(config, extra))
    local n = 0
    for _, p in m:named_parameters() do n = n + p:numel() end
    eq(F.parameters(m.config), n, 'parameters implied and built')
  end
end)

test("print(model) says the checkpoint's dropout is not applied", function()
  local s = tostring(phi())
  assert(s:find('rotary_dim=4, parallel attention and MLP', 1, true), s)
  assert(s:find('dropout of the checkpoint not applied (resid_pdrop=0.1)', 1, true), s)
end)

H.done()
