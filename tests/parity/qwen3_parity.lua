-- A Qwen3 or Qwen3-MoE folder through models.from_pretrained, for
-- test_qwen3_parity.py. arg: folder, out.json, then the texts. Writes, for the
-- first text, of each sparse layer (its MLP an nn.MoE; `sparse` lists their
-- numbers, from 1): the router logits (blocks.L.mlp.router_logits through
-- probe.run_with_cache), the anatomy name TransformerLens's
-- blocks.{l}.mlp.hook_router_logits resolves to, the MLP's input and output, and its
-- expert_out point summed over the experts against that output, the most
-- experts with a share of one token, and the logits with it hooked. For all
-- the texts: the batch's logits padded on the left with its mask, each text's
-- logits run alone, and the batch's greedy continuation (generate with the
-- attention mask and the key/value cache): family_side.padded's.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local side = require('family_side')
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')
local model = models.from_pretrained(arg[1])
local texts = {}
for i = 3, #arg do texts[#texts + 1] = arg[i] end
local out = {ids = {}, alone = {}, sparse = {}, router = {}, tl = {}, mlp_out = {}, mlp_in = {}, expert_gap = 0, experts_used = 0}
for l = 1, model.config.layers do
  if nn.typename(model.blocks[l].mlp) == 'nn.MoE' then out.sparse[#out.sparse + 1] = l end
end
if #out.sparse > 0 then
  local ids = model.tokenizer:encode(texts[1]):unsqueeze(1)
  local _, cache = probe.run_with_cache(model, ids, {filter = {'*.router_logits'}})
  local hooked, each = probe.run_with_cache(model, ids, {filter = {'*.mlp', '*.mlp.expert_out', '*.post_attention_layernorm'}})
  out.hooked_logits = hooked[1]:tolist()
  for k, l in ipairs(out.sparse) do
    local mlp = ('blocks.%d.mlp'):format(l)
    out.router[k] = cache[mlp .. '.router_logits'][1]:tolist()
    out.tl[k] = probe.from_transformer_lens(model, ('blocks.%d.mlp.hook_router_logits'):format(l - 1))
    local shares = each[mlp .. '.expert_out']  -- (B, T, E, C)
    out.mlp_out[k] = each[mlp][1]:tolist()
    out.mlp_in[k] = each[('blocks.%d.post_attention_layernorm'):format(l)][1]:tolist()
    out.expert_gap = math.max(out.expert_gap, (shares:sum(3) - each[mlp]):abs():max():item())
    out.experts_used = math.max(out.experts_used, shares:abs():sum(-1):gt(0):sum(-1):max():item())
  end
end
side.padded(model, texts, out)
fs.write_atomic(arg[2], json.encode(out))
