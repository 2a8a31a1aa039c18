-- A mixture-of-experts folder through models.from_pretrained, for
-- test_moe_parity.py. arg: folder, out.json, then the texts. Writes, for the
-- first text: each layer's router logits (blocks.L.mlp.router_logits through
-- probe.run_with_cache) and the anatomy name TransformerLens's
-- blocks.{l}.mlp.hook_router_logits resolves to; each layer's expert_out
-- point summed over the experts against the MLP's output (written too), the most experts
-- with a non-zero share of one token, and the logits with it hooked. For all
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
local out = {ids = {}, alone = {}, router = {}, tl = {}, mlp_out = {}, expert_gap = 0, experts_used = 0}
local ids = model.tokenizer:encode(texts[1]):unsqueeze(1)
local L = #model:layers()
local _, cache = probe.run_with_cache(model, ids, {filter = {'*.router_logits'}})
for l = 1, L do
  out.router[l] = cache[('blocks.%d.mlp.router_logits'):format(l)][1]:tolist()
  out.tl[l] = probe.from_transformer_lens(model, ('blocks.%d.mlp.hook_router_logits'):format(l - 1))
end
local hooked, each = probe.run_with_cache(model, ids, {filter = {'*.mlp', '*.mlp.expert_out'}})
out.hooked_logits = hooked[1]:tolist()
for l = 1, L do
  local mlp = ('blocks.%d.mlp'):format(l)
  local shares = each[mlp .. '.expert_out']  -- (B, T, E, C)
  out.mlp_out[l] = each[mlp][1]:tolist()
  out.expert_gap = math.max(out.expert_gap, (shares:sum(3) - each[mlp]):abs():max():item())
  out.experts_used = math.max(out.experts_used, shares:abs():sum(-1):gt(0):sum(-1):max():item())
end
side.padded(model, texts, out, {filter = {'*.router_logits'}})
fs.write_atomic(arg[2], json.encode(out))
