-- The left-padded batch every family's parity side writes (phi_parity.lua,
-- moe_parity.lua, qwen3_parity.lua), for family_checks.check_padded: sets in
-- out each text's ids (from 0), the batch's logits padded on the left
-- (probe.run_with_cache, with opts' filter) with its mask, each text's logits
-- run alone, and the batch's greedy continuation (generate with the attention
-- mask and the key/value cache, 6 new tokens). Returns out.
local M = {}

function M.padded(model, texts, out, opts)
  out.ids, out.alone = out.ids or {}, out.alone or {}
  local logits, cache = probe.run_with_cache(model, texts, {padding_side = 'left', filter = opts and opts.filter})
  out.padded = logits:tolist()
  out.mask = cache.mask:tolist()
  for i, text in ipairs(texts) do
    local ids = model.tokenizer:encode(text)
    out.ids[i] = (ids - 1):tolist()
    out.alone[i] = torch.no_grad(function() return model(ids:unsqueeze(1)) end)[1]:tolist()
  end
  local ids, _, mask = probe.to_ids(model, texts, {padding_side = 'left'})
  local gen = model:generate(ids, {attention_mask = mask, max_new = 6, temperature = 0, kv_cache = true})
  out.generated = (gen - 1):tolist()
  return out
end

return M
