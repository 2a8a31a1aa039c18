-- Each family of test_families_hub.py's cases, loaded from its folder and by
-- name from the Hub the test serves: writes both logits on the ids, and
-- checks the autopsy of the one from the Hub (a row per layer, each with a
-- finite removal loss; on each MoE layer, its router's entropy).
--   anatomy families_hub.lua CASES.json IDS.safetensors OUTPUT.safetensors
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')
local cases = json.decode(fs.read(arg[1]))
local ids = torch.load_safetensors(arg[2]).ids + 1  -- anatomy's ids are 1-based
local out = {}
local function check(ok, what) print((ok and 'ok    ' or 'FAIL  ') .. what) end
local covered = {}
for _, c in ipairs(cases) do covered[c.family] = true end
for family in pairs(require('anatomy.models.pretrained').families) do
  check(covered[family], ('%s: a registered family the test covers'):format(family))
end
for _, c in ipairs(cases) do
  for _, how in ipairs{'folder', 'name'} do
    local m = models.from_pretrained(c[how])
    out[c.family .. '.' .. how] = torch.no_grad(function() return m(ids) end)
    if how == 'name' then
      local a = autopsy.run(m, {ids:narrow(2, 1, 11), ids:narrow(2, 2, 11)})  -- one batch: inputs, next tokens
      local layers, finite, routed = 0, true, 0
      for _, r in ipairs(a.rows) do
        if r.kind == 'block' then
          layers = layers + 1
          finite = finite and r.removal_loss == r.removal_loss and math.abs(r.removal_loss) < math.huge
          if r.router_entropy then routed = routed + 1 end
        end
      end
      check(layers == #m:layers() and finite, ('%s: the autopsy has a row per layer (%d of %d), each with a finite removal loss'):format(
        c.family, layers, #m:layers()))
      if c.moe then
        check(routed == layers, ('%s: the router entropy of each MoE layer (%d of %d rows)'):format(c.family, routed, layers))
      else
        check(routed == 0, ('%s: no MoE columns without experts'):format(c.family))
      end
    end
  end
end
torch.save_safetensors(arg[3], out)
