-- A padded batch through a Hugging Face folder, for family_checks.py (every family parity test's padded check).
-- arg: folder, out.json, then the texts. Writes family_side.padded's: each text's ids, the batch's
-- logits padded on the left (probe.run_with_cache) with its mask, each text's
-- logits run alone, and the batch's greedy continuation (generate with the
-- attention mask and the key/value cache).
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local side = require('family_side')
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')
local model = models.from_pretrained(arg[1])
local texts = {}
for i = 3, #arg do texts[#texts + 1] = arg[i] end
fs.write_atomic(arg[2], json.encode(side.padded(model, texts, {})))
