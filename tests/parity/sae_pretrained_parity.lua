-- The anatomy side of test_sae_pretrained_parity.py: every (release, id) of
-- CASES loaded by sae.from_pretrained from the loopback Hub (HF_ENDPOINT)
-- with the registry REGISTRY, its features and reconstruction of the
-- activations in ACTS written to OUT; each loaded a second time from the
-- cache alone (local_files_only), which must give the same weights.
-- REGISTRY '-': no registry option (sae.from_pretrained finds one itself).
--   anatomy sae_pretrained_parity.lua REGISTRY ACTS CASES OUT
local registry, acts_path, cases_path, out = arg[1], arg[2], arg[3], arg[4]
if registry == '-' then registry = nil end
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')
local x = torch.load_safetensors(acts_path).x  -- (N, D)
local results = {}
local failed = 0
local function check(ok, what)
  print((ok and 'ok   ' or 'FAIL ') .. what)
  if not ok then failed = failed + 1 end
end
for i, case in ipairs(json.decode(fs.read(cases_path))) do
  local release, id = case[1], case[2]
  local s = sae.from_pretrained(release, id, {registry = registry})
  local recon, f = s:forward(x)
  results['acts_' .. i], results['recons_' .. i] = f, recon
  local src = s.hf_source
  check(type(src.commit) == 'string' and #src.commit == 40 and src.release == release and src.sae_id == id,
    ('%s %s: %s, at %s, from commit %s'):format(release, id, tostring(s), tostring(s.cfg.point), tostring(src.commit):sub(1, 12)))
  local again = sae.from_pretrained(release, id, {registry = registry, local_files_only = true})
  local same = true
  for name, p in s:named_parameters() do same = same and torch.equal(p, again[name]) end
  check(same, ('%s %s: read again from the cache alone (local_files_only), the same weights'):format(release, id))
end
torch.save_safetensors(out, results)
if failed > 0 then os.exit(1) end
