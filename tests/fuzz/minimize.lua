-- Cuts a failing run of the Lua API fuzzer (tests/fuzz/lua_api.lua) down to
-- the calls that matter (delta debugging: drop halves, then quarters, ... of
-- the calls before the failing one while the failure stays):
--   anatomy tests/fuzz/minimize.lua --seed=S --calls=K --exe=PATH/anatomy [--runs=200]
-- K is the number of the failing call (the last line of the run's --log).
-- Each try runs `exe lua_api.lua --seed=S --calls=K --only=FILE` in its own
-- process; it reproduces when that process fails (a crash, an abort, a
-- sanitizer report, or a finding) at call K. Prints the calls that remain.
local cfg = torch.config.parse({seed = 0, calls = 0, exe = '', runs = 200}, arg)
assert(cfg.seed ~= 0 and cfg.calls > 0 and cfg.exe ~= '', 'usage: minimize.lua --seed=S --calls=K --exe=PATH')
local fuzzer = (arg[0]:match('^(.*)/') or '.') .. '/lua_api.lua'
local fs = require('anatomy.io.fs')
local dir = os.tmpname()
os.remove(dir)
fs.mkdir(dir)
local K = cfg.calls
local runs = 0

-- whether running `calls` (a sorted list of numbers, K last) fails at call K
local function fails(calls)
  runs = runs + 1
  local list = dir .. '/only'
  local f = assert(io.open(list, 'w'))
  f:write(table.concat(calls, '\n'), '\n')
  f:close()
  local cmd = ('ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1:quarantine_size_mb=16 %s --threads=1 %s --seed=%d --calls=%d --only=%s --log=%s/log >%s/out 2>&1; echo $?')
    :format(fs.quote(cfg.exe), fs.quote(fuzzer), cfg.seed, K, fs.quote(list), fs.quote(dir), fs.quote(dir))
  local p = io.popen(cmd)
  local rc = tonumber(p:read('*a'))
  p:close()
  if rc == 0 then return false end
  local last
  for line in io.lines(dir .. '/log') do last = line end
  return last ~= nil and tonumber(last:match('^(%d+) ')) == K
end

local calls = {}
for i = 1, K do calls[i] = i end
if not fails(calls) then
  print(('minimize: seed %d does not fail at call %d when rerun; nothing to cut'):format(cfg.seed, K))
  os.exit(1)
end
-- ddmin over the calls before K (K itself always stays)
local n = 2
while #calls > 1 and runs < cfg.runs do
  local before = #calls - 1
  local chunk = math.ceil(before / n)
  local cut = false
  for start = 1, before, chunk do
    local kept = {}
    for i, c in ipairs(calls) do
      if i < start or i >= start + chunk or i == #calls then kept[#kept + 1] = c end
    end
    if #kept < #calls and fails(kept) then
      calls, cut = kept, true
      n = math.max(n - 1, 2)
      break
    end
    if runs >= cfg.runs then break end
  end
  if not cut then
    if chunk <= 1 then break end
    n = math.min(n * 2, before)
  end
end
fails(calls)  -- leave the log of the minimal sequence
print(('minimize: seed %d, call %d fails with %d call%s of %d (%d runs):'):format(cfg.seed, K, #calls, #calls == 1 and '' or 's', K, runs))
for line in io.lines(dir .. '/log') do print('  ' .. line) end
local out = fs.read(dir .. '/out')
print('  ' .. (out:match('[^\n]*ERROR[^\n]*') or out:match('[^\n]*FINDING[^\n]*') or out:match('[^\n]*runtime error[^\n]*') or out:sub(-300)))
os.execute('rm -rf ' .. fs.quote(dir))
