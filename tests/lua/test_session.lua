-- The session layer (lua/anatomy/session/): help and the reference it writes.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require 'harness'
local test, eq = H.test, H.eq

test('docs/reference.md says what help says: it is help.reference(), regenerated', function()
  local help = require 'anatomy.session.help'
  for _, family in ipairs{'gpt2', 'llama', 'gpt_neox'} do require('anatomy.models.' .. family) end  -- loaded on first use
  local root = (arg[0]:match('^(.*)/') or '.') .. '/../..'
  local f = io.open(root .. '/docs/reference.md', 'rb')
  assert(f, 'docs/reference.md is missing: anatomy scripts/reference.lua writes it')
  local written = f:read('*a')
  f:close()
  local now = help.reference() .. '\n'
  if written ~= now then
    local a, b = {}, {}
    for line in written:gmatch('[^\n]*') do a[#a + 1] = line end
    for line in now:gmatch('[^\n]*') do b[#b + 1] = line end
    local i = 1
    while a[i] == b[i] do i = i + 1 end
    error(('docs/reference.md differs from help at line %d:\n  file: %s\n  help: %s\n(anatomy scripts/reference.lua rewrites it)'):format(
      i, tostring(a[i]), tostring(b[i])), 0)
  end
  -- and it documents what a user reaches for first
  for _, name in ipairs{'train.fit', 'probe.run_with_cache', 'autopsy.run', 'models.from_pretrained', 'data.text', 'probe.clear'} do
    assert(now:find('`' .. name .. '`', 1, true), name .. ' is in the reference')
  end
end)

H.done()
