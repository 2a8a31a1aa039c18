-- A padded batch through a Hugging Face folder, for family_checks.py (every family parity test's padded check).
-- arg: folder, out.json, then the texts. Writes each text's ids, the batch's
-- logits padded on the left (probe.run_with_cache) with its mask, each text's
-- logits run alone, and the batch's greedy continuation (generate with the
-- attention mask and the key/value cache).
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')
local model = models.from_pretrained(arg[1])
local texts = {}
for i = 3, #arg do texts[#texts + 1] = arg[i] end
local out = {ids = {}, alone = {}}
local logits, cache = probe.run_with_cache(model, texts, {padding_side = 'left'})
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
fs.write_atomic(arg[2], json.encode(out))
