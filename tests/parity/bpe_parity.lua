-- Encodes and decodes texts with data.tokenizer, for test_bpe_parity.py.
-- arg: tokenizer path (file or folder), texts.json, ids.json (Hugging Face's
-- ids, 0-based, to decode), out.json
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')
local tok = data.tokenizer(arg[1])
local texts = json.decode(fs.read(arg[2]))
local hf_ids = json.decode(fs.read(arg[3]))
local out = {vocab_size = tok.vocab_size, encoded = {}, plain = {}, decoded = {}, decoded_skip = {}}
local function zero_based(t)
  local list = {}
  for i = 1, t:numel() do list[i] = t[i]:item() - 1 end
  return list
end
for i, text in ipairs(texts) do
  out.encoded[i] = zero_based(tok:encode(text))
  out.plain[i] = zero_based(tok:encode(text, {add_special_tokens = false}))
  local ids = {}
  for k, id in ipairs(hf_ids[i]) do ids[k] = id + 1 end
  out.decoded[i] = tok:decode(ids)
  out.decoded_skip[i] = tok:decode(ids, {skip_special_tokens = true})
end
fs.write_atomic(arg[4], json.encode(out))
