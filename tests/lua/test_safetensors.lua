-- torch.save_safetensors / torch.load_safetensors from Lua.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, close, raises = H.test, H.eq, H.close, H.raises

test('round trip with metadata and file order', function()
  local path = os.tmpname()
  local a, b = torch.randn(3, 4), torch.arange(5)
  torch.save_safetensors(path, {b = b, a = a, mask = a:gt(0)}, {note = 'hello', step = 12})
  local t, meta, order = torch.load_safetensors(path)
  close(t.a, a, 0)
  eq(t.b:tolist(), b:tolist())
  eq(t.b.dtype, 'int64')
  eq(t.mask.dtype, 'bool')
  eq(meta.note, 'hello')
  eq(meta.step, '12')
  eq(order, {'a', 'b', 'mask'}, 'written sorted by name')
  os.remove(path)
end)

test('bad arguments and bad files are errors, not crashes', function()
  raises(function() torch.save_safetensors('/tmp/x.safetensors', {a = 1}) end,
    "bad argument #2 to 'save_safetensors' (entry 'a' is number, expected a Tensor)")
  raises(function() torch.save_safetensors('/tmp/x.safetensors', {torch.ones(1)}) end,
    "bad argument #2 to 'save_safetensors' (tensor names must be strings, got a number key)")
  raises(function() torch.load_safetensors('/no/such.safetensors') end,
    "cannot open '/no/such.safetensors': No such file or directory")
  local path = os.tmpname()
  local f = io.open(path, 'wb')
  f:write('\16\0\0\0\0\0\0\0{"a": [1, 2, 3]}')
  f:close()
  raises(function() torch.load_safetensors(path) end,
    "'" .. path .. "' is not a valid safetensors file: tensor 'a' lacks dtype, shape or data_offsets")
  os.remove(path)
  raises(function() torch.save_safetensors('/no/such/dir/x.safetensors', {a = torch.ones(1)}) end,
    "cannot write '/no/such/dir/x.safetensors': No such file or directory")
end)

test('safe_open reads the header, then one tensor at a time', function()
  local path = os.tmpname()
  torch.save_safetensors(path, {a = torch.arange(1, 7):view(2, 3), b = torch.tensor({true, false})}, {who = 'me'})
  local f = torch.safe_open(path)
  local keys = f:keys()
  table.sort(keys)
  eq(keys, {'a', 'b'})
  eq(f:shape('a'), {2, 3})
  eq(f:dtype('b'), 'bool')
  eq(f:get_tensor('a'):tolist(), {{1, 2, 3}, {4, 5, 6}})
  eq(f:get_tensor('b'):tolist(), {true, false})
  eq(f:metadata().who, 'me')
  local p = torch.zeros(2, 3, {dtype = 'int64', device = 'cpu'})  -- in place: into CPU memory only
  eq(f:read_into('a', p), true, 'same dtype and shape: read in place')
  if torch.device() ~= 'cpu' then
    eq(f:read_into('a', torch.zeros(2, 3, {dtype = 'int64'})), false, 'a tensor on ' .. torch.device() .. ': not in place')
  end
  eq(p:tolist(), {{1, 2, 3}, {4, 5, 6}})
  local wrong = torch.zeros(3, 2, {dtype = 'int64', device = 'cpu'})
  eq(f:read_into('a', wrong), false, 'another shape: nothing read')
  eq(wrong:sum():item(), 0)
  raises(function() f:get_tensor('c') end, "bad argument #1 to 'get_tensor' (no tensor c in '" .. path .. "')")
  os.remove(path)
  raises(function() torch.safe_open(path) end, "cannot open '" .. path .. "': No such file or directory")
end)

-- A safetensors shape whose byte count wraps past 2^64 ([2^62 + 1] of F32 is
-- 2^64 + 4 bytes, which wraps to 4) passed the reader's size check and
-- reached LibTorch's raw "Storage size calculation overflowed".
test('a safetensors shape of more than 2^63 bytes is refused by the reader', function()
  local function craft(header, body)
    local len = ''
    for i = 0, 7 do len = len .. string.char(math.floor(#header / 256 ^ i) % 256) end
    return H.tmpfile(len .. header .. body)
  end
  local path = craft('{"x":{"dtype":"F32","shape":[4611686018427387905],"data_offsets":[0,4]}}', '\0\0\0\0')
  raises(function() return torch.load_safetensors(path) end,
    ("'%s' is not a valid safetensors file: tensor 'x' has a shape too large to exist: [4611686018427387905] of F32 is more than 2^63 bytes"):format(path))
  path = craft('{"x":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,4]}}', '\0\0\0\0')
  raises(function() return torch.load_safetensors(path) end,
    ("'%s' is not a valid safetensors file: tensor 'x' has a shape too large to exist: [18446744073709551615]"):format(path))
end)

H.done()
