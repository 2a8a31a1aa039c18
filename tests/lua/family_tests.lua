-- Checks every family's Lua test (test_phi.lua, test_gptj.lua, ...) makes on
-- its own tiny model: the autopsy's rows, and the parameter count a config
-- implies (what pretrained.check_size compares) against the model built.
local H = require('harness')
local eq = H.eq

local M = {}

-- The autopsy of m on two random batches of (2, T or 8) tokens of vocabulary
-- V: a row per layer named as `blocks` lists them, each with a removal and a
-- lens loss that are numbers; the first layer's Hugging Face name is hf_name
-- (where given).
function M.autopsy_rows(m, V, blocks, hf_name, T)
  T = T or 8
  local a = autopsy.run(m, {torch.randint(1, V + 1, {2, T}), torch.randint(1, V + 1, {2, T})})
  local got = {}
  for _, r in ipairs(a.rows) do
    if r.kind == 'block' then
      got[#got + 1] = r.name
      assert(r.removal_loss == r.removal_loss and r.lens_loss == r.lens_loss, r.name .. ': removal and lens losses are numbers')
    end
  end
  eq(got, blocks)
  if hf_name then eq(a.rows[2].hf_name, hf_name) end
end

-- For config and config with each of extras merged in: the family's
-- parameters(settings) equal the numbers of the model from_config builds.
function M.parameters_implied(family, config, extras)
  local F = require('anatomy.models.' .. family)
  for _, extra in ipairs(extras) do
    local m = models.from_config(H.merged(config, extra))
    local n = 0
    for _, p in m:named_parameters() do n = n + p:numel() end
    eq(F.parameters(m.config), n, 'parameters implied and built')
  end
end

return M
