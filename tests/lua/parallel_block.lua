-- The parallel block's TransformerLens names and stream (family.lua's
-- parallel_block: x + attn(ln(x)) + mlp(ln(x))), as Phi's and GPT-J's tests
-- check them on a 3-layer model m of vocabulary V whose MLP is fc then
-- gelu_new: the names resolve to anatomy's (n.block the blocks' folder, n.attn
-- the attention, n.ln its one norm, n.final the final norm, n.rot the rotated
-- q or k listed), there is no ln2 nor resid_mid, every hook point on leaves
-- the logits, resid_post = resid_pre + attn_out + mlp_out, and the MLP reads
-- ln1's output.
local H = require('harness')
local eq, close = H.eq, H.close

local M = {}

local function param(m, name)
  for n, p in m:named_parameters() do if n == name then return p end end
  error('no parameter ' .. name)
end

function M.check(m, V, n)
  local tl = function(name) return probe.from_transformer_lens(m, name) end
  local block = function(l) return n.block .. '.' .. l end
  eq(tl('blocks.0.hook_resid_pre'), block(1) .. '.resid_pre')
  eq(tl('blocks.2.hook_resid_post'), block(3) .. '.resid_post')
  eq(tl('blocks.1.attn.hook_z'), block(2) .. '.' .. n.attn .. '.z')
  eq(tl('blocks.0.mlp.hook_post'), block(1) .. '.mlp.post')
  eq(tl('blocks.0.ln1.hook_normalized'), block(1) .. '.' .. n.ln .. '.normalized')
  eq(tl('blocks.0.hook_attn_out'), block(1) .. '.' .. n.attn)
  eq(tl('ln_final.hook_normalized'), n.final .. '.normalized')
  H.raises_part(function() tl('blocks.0.ln2.hook_normalized') end, block(1) .. ' has no ln2')
  local listed = {}
  for _, pair in ipairs(probe.transformer_lens_names(m)) do listed[pair[1]] = pair[2] end
  eq(listed['blocks.0.hook_resid_mid'], nil, 'no stream between attention and MLP')
  eq(listed['blocks.2.attn.hook_' .. n.rot], block(3) .. '.' .. n.attn .. '.' .. n.rot)
  local ids = torch.randint(1, V + 1, {2, 9})
  local logits, cache = probe.run_with_cache(m, ids)
  close(logits, m(ids), 1e-5, 'logits with every hook point on (each block on its explicit path)')
  local worst = 0
  for l = 0, 2 do
    local b = 'blocks.' .. l .. '.'
    local sum = cache[b .. 'hook_resid_pre'] + cache[b .. 'hook_attn_out'] + cache[b .. 'hook_mlp_out']
    worst = math.max(worst, (sum - cache[b .. 'hook_resid_post']):abs():max():item())
    -- one norm feeds both: the MLP's input is the norm's output (ln1.hook_out; hook_normalized is before its affine)
    local w, bias = param(m, block(l + 1) .. '.mlp.fc.weight'), param(m, block(l + 1) .. '.mlp.fc.bias')
    local pre = nn.functional.linear(cache[b .. 'ln1.hook_out'], w, bias)
    close(cache[b .. 'mlp.hook_pre'], pre, 1e-5, b .. 'mlp.hook_pre from ln1')
    close(cache[b .. 'mlp.hook_post'], nn.functional.gelu(pre, {approximate = 'tanh'}), 1e-5, b .. 'gelu_new')
  end
  assert(worst <= 1e-5, ('resid_post = resid_pre + attn_out + mlp_out to %.3g'):format(worst))
  print(('  resid_post against resid_pre + attn_out + mlp_out: largest difference %.3g'):format(worst))
end

return M
