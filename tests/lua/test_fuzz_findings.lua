-- Regression tests for what the fuzz targets (tests/fuzz, scripts/fuzz)
-- found, each named after what it does; the fix is in the library, and the
-- input that found it is here in its smallest form. (The tokenizer.json
-- findings are in test_tokenizer.lua, beside the reader's other refusals.)
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require 'harness'
local test, eq, raises = H.test, H.eq, H.raises
local json = require 'anatomy.json'

-- lua_readers: a string with DEL (0x7f) in it made json.decode loop forever
-- (Lua's %c matches DEL; the scan made no progress on it).
test('json.decode takes DEL as the ordinary character it is, and an unterminated string ends in an error', function()
  eq(json.decode('"a\127b"'), 'a\127b')
  eq(json.decode('{"k": "\127\127"}').k, '\127\127')
  raises(function() json.decode('"\127\127\127-') end, 'json.decode: unterminated string at byte 6')
  raises(function() json.decode('"a\1b"') end, 'json.decode: control character in a string at byte 3')
end)

-- lua_readers: torch.config.parse with --help in a table ended the process
-- (os.exit), and a REPL session with it.
test('torch.config.parse with --help from a table prints the options and returns the defaults', function()
  local c = torch.config.parse({steps = 10, lr = 0.5}, {'--help'})
  eq(c.steps, 10)
  eq(c.lr, 0.5)
end)

-- The metrics log a run killed mid-write leaves: its last line cut short.
test('train.read_metrics skips a last line cut short and refuses a bad line elsewhere', function()
  local path = os.tmpname()
  local f = io.open(path, 'wb')
  f:write('{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.25}\n{"step": 3, "lo')
  f:close()
  local r = train.read_metrics(path)
  eq(#r, 2)
  eq(r[2].loss, 2.25)
  f = io.open(path, 'wb')
  f:write('{"step": 1}\nnot json\n{"step": 3}\n')
  f:close()
  raises(function() train.read_metrics(path) end, ('train.read_metrics: %s: line 2 is not a JSON object: json.decode: unexpected \'n\' at byte 1'):format(path))
  os.remove(path)
  raises(function() train.read_metrics(path) end, ('train.read_metrics: cannot open %s: No such file or directory'):format(path))
end)

H.done()
