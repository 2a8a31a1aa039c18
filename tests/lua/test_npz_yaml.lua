-- torch.load_npz / torch.save_npz against numpy (build/venv's), and
-- yaml.decode / yaml.read against PyYAML on SAELens's release registry
-- (build/venv-sae's). Values are compared exactly.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, raises_part = H.test, H.eq, H.raises_part
local json = require('anatomy.io.json')
local yaml = require('anatomy.io.yaml')
local native = require('anatomy.torch.native')

local root = (arg[0]:match('^(.*)/tests/lua/') or '.')
local function python_at(venv)
  local p = root .. '/build/' .. venv .. '/bin/python'
  local f = io.open(p, 'rb')
  if f then f:close() return p end
end

-- runs python code (a file) with arguments; returns its stdout, or an error with its output
local function python(py, code, ...)
  local script = H.tmpfile(code)
  local args = {}
  for _, a in ipairs{...} do args[#args + 1] = "'" .. a .. "'" end
  local p = io.popen(("'%s' '%s' %s 2>&1"):format(py, script, table.concat(args, ' ')))
  local out = p:read('*a')
  local ok = p:close()
  os.remove(script)
  if not ok then error('python failed:\n' .. out, 2) end
  return out
end

-- numpy writes every dtype, Fortran order and big-endian arrays, stored and
-- compressed; expect.json holds each array's dtype, shape and values (C order)
local write_arrays = [==[
import json, sys
import numpy as np
rng = np.random.default_rng(0)
a = {
  'f4': rng.standard_normal((3, 5)).astype(np.float32),
  'f8': rng.standard_normal(4),
  'f2': rng.standard_normal((2, 2)).astype(np.float16),
  'i1': np.array([-128, 0, 127], dtype=np.int8),
  'i2': np.array([-32768, 32767], dtype=np.int16),
  'i4': np.array([-2**31, 2**31 - 1], dtype=np.int32),
  'i8': np.array([-2**53, 2**53], dtype=np.int64),
  'u1': np.array([0, 200, 255], dtype=np.uint8),
  'b1': np.array([[True, False], [False, True]]),
  'fortran': np.asfortranarray(rng.standard_normal((2, 3, 4)).astype(np.float32)),
  'big_f8': np.arange(5, dtype='>f8') / 3,
  'big_i2': np.array([1, -2, 300], dtype='>i2'),
  'scalar': np.float64(2.5),
  'empty': np.zeros((0, 3), dtype=np.float32),
}
assert a['fortran'].flags['F_CONTIGUOUS'] and not a['fortran'].flags['C_CONTIGUOUS']
np.savez(sys.argv[1] + '/stored.npz', **a)
np.savez_compressed(sys.argv[1] + '/compressed.npz', **a)
expect = {k: {'dtype': v.dtype.str[1:], 'shape': list(v.shape),
              'values': np.ravel(v, order='C').astype(np.float64 if v.dtype.kind == 'f' else np.int64).tolist()}
          for k, v in a.items()}
json.dump(expect, open(sys.argv[1] + '/expect.json', 'w'))
np.savez(sys.argv[1] + '/object.npz', o=np.array([{'a': 1}, None], dtype=object))
np.savez(sys.argv[1] + '/structured.npz', s=np.zeros(2, dtype=[('x', '<f4'), ('y', '<i4')]))
np.savez(sys.argv[1] + '/complex.npz', c=np.ones(2, dtype=np.complex64))
]==]

local dtypes = {f4 = 'float32', f8 = 'float64', f2 = 'float16', i1 = 'int8', i2 = 'int16', i4 = 'int32', i8 = 'int64',
  u1 = 'uint8', b1 = 'bool'}

local function check_arrays(t, names, expect, where)
  local n = 0
  for name, e in pairs(expect) do
    n = n + 1
    local got = t[name]
    assert(got, where .. ': no array ' .. name)
    eq(got.dtype, dtypes[e.dtype], where .. ' ' .. name .. ' dtype')
    eq(got:size(), e.shape, where .. ' ' .. name .. ' shape')
    local want = torch.tensor(#e.values > 0 and e.values or {}, {dtype = 'float64'})
    local flat = got:reshape(-1):to('float64')
    eq(flat:numel(), want:numel(), where .. ' ' .. name .. ' count')
    if want:numel() > 0 then
      local d = (flat - want):abs():max():item()
      if d ~= 0 then error(('%s %s: largest difference %.3g (exact expected)'):format(where, name, d), 2) end
    end
  end
  eq(#names, n, where .. ': one name per array')
end

test('arrays numpy wrote read back exactly (every dtype, Fortran order, big-endian, compressed)', function()
  local py = python_at('venv')
  if not py then H.skip('build/venv/bin/python is missing: scripts/setup --tests makes it') end
  local dir = H.tmpdir()
  python(py, write_arrays, dir)
  local expect = json.decode(H.read(dir .. '/expect.json'))
  for _, file in ipairs{'stored', 'compressed'} do
    local t, names = torch.load_npz(dir .. '/' .. file .. '.npz')
    check_arrays(t, names, expect, file)
    eq(t.fortran:is_contiguous(), true, 'a Fortran-order array comes back contiguous')
  end
  raises_part(function() torch.load_npz(dir .. '/object.npz') end,
    "torch.load_npz: '" .. dir .. "/object.npz': member 'o.npy': dtype '|O' is an object array")
  raises_part(function() torch.load_npz(dir .. '/structured.npz') end, "member 's.npy': the dtype is a list of fields")
  raises_part(function() torch.load_npz(dir .. '/complex.npz') end, "member 'c.npy': dtype '<c8' is a complex type")
  os.execute("rm -rf '" .. dir .. "'")
end)

test('torch.save_npz writes what numpy reads, atomically', function()
  local dir = H.tmpdir()
  local a = {W_enc = torch.randn(4, 6), b_dec = torch.randn(6):to('float64'), threshold = torch.rand(6):to('float16'),
    ids = torch.arange(5), mask = torch.randn(3):gt(0), scalar = torch.tensor(1.25), T = torch.randn(3, 2):t()}
  torch.save_npz(dir .. '/s.npz', a)
  torch.save_npz(dir .. '/c.npz', a, {compressed = true})
  for _, f in ipairs{'s', 'c'} do
    local t, names = torch.load_npz(dir .. '/' .. f .. '.npz')
    eq(names, {'T', 'W_enc', 'b_dec', 'ids', 'mask', 'scalar', 'threshold'}, 'members in name order')
    for k, v in pairs(a) do
      eq(t[k].dtype, v.dtype, k)
      H.identical(t[k]:to('float64'), v:to('float64'), f .. ' ' .. k)
    end
  end
  local py = python_at('venv')
  if py then
    local out = python(py, [[
import sys, numpy as np
for f in sys.argv[2:]:
    d = np.load(sys.argv[1] + '/' + f, allow_pickle=False)
    print(f, ' '.join('%s:%s:%s' % (k, d[k].dtype.str, 'x'.join(map(str, d[k].shape))) for k in sorted(d.files)),
          repr(float(d['W_enc'][1, 2])), int(d['ids'].sum()), int(d['mask'].sum()))
]], dir, 's.npz', 'c.npz')
    local lines = 0
    for line in out:gmatch('[^\n]+') do
      lines = lines + 1
      local file, types, w, ids, mask = line:match('^(%S+) (.-) (%S+) (%S+) (%S+)$')
      eq(types, 'T:<f4:2x3 W_enc:<f4:4x6 b_dec:<f8:6 ids:<i8:5 mask:|b1:3 scalar:<f4: threshold:<f2:6',
        file .. ': numpy sees the dtypes and shapes')
      eq(tonumber(w), a.W_enc[2][3]:item(), file .. ': numpy reads the same W_enc[1, 2]')
      eq(tonumber(ids), 10, file .. ': ids')
      eq(tonumber(mask), a.mask:sum():item(), file .. ': mask')
    end
    eq(lines, 2, 'numpy read both files')
  end
  local before = H.read(dir .. '/s.npz')
  raises_part(function() torch.save_npz(dir .. '/s.npz', {x = torch.randn(2):to('bfloat16')}) end,
    "torch.save_npz: '" .. dir .. "/s.npz': tensor 'x' is BFloat16, which has no numpy dtype")
  eq(H.read(dir .. '/s.npz') == before, true, 'a refused write leaves the old file')
  raises_part(function() torch.save_npz(dir .. '/s.npz', a, {compresed = true}) end, "unknown option 'compresed'")
  raises_part(function() torch.save_npz(dir .. '/s.npz', {x = 1}) end, "entry 'x' is number, expected a Tensor")
  raises_part(function() torch.load_npz(dir .. '/none.npz') end, "torch.load_npz: '" .. dir .. "/none.npz'")
  os.execute("rm -rf '" .. dir .. "'")
end)

test('yaml.decode: core schema scalars, null sentinel, shared aliases, positioned errors', function()
  local v = yaml.decode('a: 1\nb: [0x10, 1.5e3, .inf, true, yes, "1", ~]\nc: &x {k: v}\nd: *x\ne:\n')
  eq(v.a, 1)
  eq(v.b[1], 16)
  eq(v.b[2], 1500)
  eq(v.b[3], math.huge)
  eq(v.b[4], true)
  eq(v.b[5], 'yes', 'YAML 1.1 words are strings in 1.2')
  eq(v.b[6], '1')
  eq(v.b[7] == yaml.null and yaml.null == json.null, true, 'null is the json.null sentinel')
  eq(#v.b, 7)
  eq(v.c == v.d, true, 'an alias is the same table')
  eq(v.e == yaml.null, true, 'a key without a value is present, null')
  raises_part(function() yaml.decode('a: 1\na: 2\n', 'x.yaml') end,
    "yaml.decode: x.yaml: line 2, column 1: the key 'a' appears twice in a map (first at line 1, column 1)")
  raises_part(function() yaml.decode(string.rep('[', 10000)) end, 'yaml.decode: <string>: line 1, column ')
  raises_part(function() yaml.decode(string.rep('[', 300) .. string.rep(']', 300)) end, 'nest deeper than 256 levels')
  raises_part(function() yaml.decode(42) end, 'yaml.decode: text must be a string, got a number')
  local path = H.tmpfile('releases:\n  x: [1, 2\n')
  raises_part(function() yaml.read(path) end, "yaml.read: '" .. path .. "': line 3, column 1: end of sequence flow not found")
  os.remove(path)
  raises_part(function() yaml.read('/no/such.yaml') end, "yaml.read: cannot read '/no/such.yaml'")
end)

test("SAELens's pretrained_saes.yaml reads as PyYAML reads it", function()
  local py = python_at('venv-sae')
  if not py then H.skip('build/venv-sae is missing (scripts/setup --tests makes it): no sae-lens registry to read') end
  local ref_path = os.tmpname()
  local out = python(py, [[
import json, sys, time, yaml, sae_lens, os
path = os.path.join(os.path.dirname(sae_lens.__file__), 'pretrained_saes.yaml')
t = time.time(); d = yaml.load(open(path), Loader=getattr(yaml, 'CSafeLoader', yaml.SafeLoader)); t = time.time() - t
json.dump(d, open(sys.argv[1], 'w'))
print(path); print(t)
]], ref_path)
  local path, pyseconds = out:match('^(%S+)\n(%S+)')
  local ref = json.decode(H.read(ref_path))
  os.remove(ref_path)
  local t0 = native.now()
  local v = yaml.read(path)
  local seconds = native.now() - t0
  local differences, values = 0, 0
  local function compare(a, b, where)
    if b == json.null then b = yaml.null end
    values = values + 1
    if type(a) ~= type(b) or (type(a) ~= 'table' and a ~= b) then
      differences = differences + 1
      if differences <= 5 then print(('  differs at %s: %s against PyYAML\'s %s'):format(where, tostring(a), tostring(b))) end
      return
    end
    if type(a) == 'table' and a ~= yaml.null then
      for k, x in pairs(a) do compare(x, b[k], where .. '/' .. tostring(k)) end
      for k in pairs(b) do if a[k] == nil then compare(nil, b[k], where .. '/' .. tostring(k)) end end
    end
  end
  compare(v, ref, '')
  local releases = 0
  for _ in pairs(v) do releases = releases + 1 end
  print(('  %s: %d releases, %d values, %d differences from PyYAML; %.3f s (PyYAML %.3f s)'):format(
    path, releases, values, differences, seconds, tonumber(pyseconds)))
  eq(differences, 0, 'values that differ from PyYAML\'s')
  eq(releases > 100, true, 'the registry holds its releases')
end)

os.exit(H.done())
