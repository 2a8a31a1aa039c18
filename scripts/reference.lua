-- Writes docs/reference.md: every global's functions with the documentation
-- help() prints, from the library's own comments (session/help.lua).
--   anatomy scripts/reference.lua [--out=docs/reference.md]
local cfg = torch.config.parse({
  out = 'docs/reference.md',  -- where the reference goes
}, arg, 'usage: anatomy scripts/reference.lua [--out=FILE]')
local fs = require('anatomy.io.fs')
for _, family in ipairs{'gpt2', 'llama', 'gpt_neox'} do require('anatomy.models.' .. family) end  -- loaded on first use
fs.write_atomic(cfg.out, require('anatomy.session.help').reference() .. '\n')
print('wrote ' .. cfg.out)
