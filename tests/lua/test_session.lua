-- The session layer (lua/anatomy/session/): help and the reference it writes.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
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

test('help() lists every global table, and every public function has documentation', function()
  local help = require 'anatomy.session.help'
  local std = {string = 1, table = 1, math = 1, io = 1, os = 1, debug = 1, coroutine = 1, package = 1, jit = 1, bit = 1,
    _G = 1, arg = 1, ffi = 1}
  local start = help.text()
  local globals = {}
  for k, v in pairs(_G) do if type(v) == 'table' and not std[k] then globals[#globals + 1] = k end end
  table.sort(globals)
  for _, g in ipairs{'torch', 'nn', 'models', 'data', 'train', 'probe', 'patching', 'autopsy', 'experiment', 'exact', 'dist', 'text'} do
    assert(type(_G[g]) == 'table', g .. ' is a global table')
  end
  for _, g in ipairs(globals) do
    assert(start:find('\n  ' .. g .. ' ', 1, true), "help() does not list the global table '" .. g .. "'")
  end
  -- the causal tools a newcomer looks for are named where help() starts
  for _, f in ipairs{'patching.attribute', 'patching.edges', 'probe.run_with_hooks', 'probe.with'} do
    assert(start:find(f, 1, true), "help() does not name " .. f)
  end
  for _, family in ipairs{'gpt2', 'llama', 'gpt_neox'} do require('anatomy.models.' .. family) end  -- loaded on first use
  local missing, seen = {}, {}
  local function walk(prefix, t, depth)
    if seen[t] or depth > 3 then return end
    seen[t] = true
    for k, v in pairs(t) do
      if type(k) == 'string' and not k:match('^_') then
        if type(v) == 'function' then
          if not help.doc(v) then missing[#missing + 1] = prefix .. k end
        elseif type(v) == 'table' and not torch.is_tensor(v) then
          walk(prefix .. k .. '.', v, depth + 1)
        end
      end
    end
  end
  for _, g in ipairs(globals) do walk(g .. '.', _G[g], 1) end
  table.sort(missing)
  eq(missing, {}, 'public functions without documentation')
  for _, name in ipairs{'nn.block', 'nn.call_child', 'nn.class', 'models.gpt'} do
    assert(not help.text(name):find('without documentation', 1, true), name)
  end
  local _, cache = probe.run_with_cache(models.gpt{vocab = 5, dim = 8, heads = 2, layers = 1, seq = 4, ffn = 8},
    torch.tensor({{1, 2}}, {dtype = 'int64'}))
  local h = help.text(cache)
  assert(h:find('probe.Cache', 1, true) and h:find('stack ', 1, true) and h:find('attention ', 1, true), h)
  torch.set_num_threads(1)
  assert(torch.banner():find(', 1 thread)', 1, true), torch.banner())
end)

H.done()
