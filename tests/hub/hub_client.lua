-- What test_hub.py asks of anatomy, one command a run (the Hub is the fake
-- one test_hub.py serves; HF_ENDPOINT and HF_HUB_CACHE say where):
--   load NAME REVISION OUT.json       models.from_pretrained by name: the logits of
--                                     a fixed text, the folder it came from
--   tokenize NAME REVISION TEXT OUT   data.tokenizer by name: the ids of TEXT
--   download NAME FILE REVISION       hub.hf_hub_download; prints the path
--   refs NAME OUT.json                hub.list_repo_refs
-- REVISION '-' is the default (main). An error ends the run with it on stderr.
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')
local command, name = arg[1], arg[2]
local function revision(r) return r ~= '-' and r or nil end

if command == 'load' then
  local model, tok = models.from_pretrained(name, {revision = revision(arg[3])})
  local ids = tok:encode('the quick brown fox'):unsqueeze(1)
  local logits = torch.no_grad(function() return model(ids) end)
  fs.write_atomic(arg[4], json.encode({logits = logits[1]:tolist(), ids = ids[1]:tolist(), folder = model.hf_folder}))
elseif command == 'tokenize' then
  local tok = data.tokenizer(name, {revision = revision(arg[3])})
  fs.write_atomic(arg[5], json.encode({ids = tok:encode(arg[4]):tolist(), path = tok.path}))
elseif command == 'download' then
  print(hub.hf_hub_download(name, arg[3], {revision = revision(arg[4])}))
elseif command == 'refs' then
  fs.write_atomic(arg[3], json.encode(hub.list_repo_refs(name)))
else
  error('hub_client.lua: unknown command ' .. tostring(command))
end
