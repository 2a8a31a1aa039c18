-- A random-call fuzzer of the Lua API, run by anatomy itself (the sanitizer
-- build, scripts/fuzz --lua):
--   anatomy tests/fuzz/lua_api.lua [--calls=N] [--seed=S | --replay=S] [--only=FILE] [--log=PATH] [--verbose=true]
-- It enumerates at run time every function the library exports (torch.*,
-- tensor methods and operators, nn blocks, optim, probe, patching, data,
-- train, text, autopsy, exact, metrics, models and the methods of the
-- userdata they return) and every function in the metatables of the objects
-- they make (metamethods too, through debug.getmetatable), so a new binding
-- is fuzzed without editing this file, and calls
-- them in random order with arguments drawn from a typed pool: tensors of
-- every dtype, 0-dim, empty, non-contiguous, expanded, NaN/Inf, int64
-- extremes; numbers 0, -1, 0.5, 2^53, nan, inf, huge; exact rationals; strings empty, long,
-- invalid UTF-8, paths that do not exist; nil, booleans, tables empty,
-- nested, cyclic; functions that error or yield; models whose probes raise,
-- return the wrong shape or call the model again from inside its forward;
-- results of earlier calls (used again after collectgarbage). Every call runs
-- under pcall, one in 20 inside a coroutine. The rule: a Lua error must
-- carry a message; anything that ends the process (a crash, an abort, a sanitizer report) is a
-- finding, and the log (each call written and flushed before it runs) says
-- which call it was: --replay=SEED (or the same --seed) reproduces it, and
-- tests/fuzz/minimize.lua cuts the sequence to the calls that matter.
local native = require('anatomy.torch.native')
local cfg = torch.config.parse({calls = 10000, seed = 1, replay = 0, only = '', log = '', verbose = false}, arg)
if cfg.replay ~= 0 then cfg.seed = cfg.replay end
local seed = cfg.seed
math.randomseed(seed)
torch.manual_seed(seed)
-- --only=FILE: run only the calls whose numbers the file lists (one a line),
-- the others drawn but not made: the minimizer (tests/fuzz/minimize.lua)
-- cuts a failing sequence down this way. Each call's draws come from its own
-- seed (the run's seed and its number), so leaving calls out does not change
-- the ones that stay.
local only
if cfg.only ~= '' then
  only = {}
  for line in io.lines(cfg.only) do
    local n = tonumber(line)
    if n then only[n] = true end
  end
end

-- What is never called: what ends or blocks the process, writes outside the
-- scratch folder, or runs for as long as it is asked to (training loops,
-- experiments: their arguments are sizes the fuzzer would make astronomical),
-- or joins a process group over the network (dist: a world of 2 waits for its
-- other rank until the timeout; tests/lua/test_dist.lua checks its errors).
local skip = {
  ['torch.cuda'] = true, ['torch.config.parse'] = false,
  ['train.fit'] = true, ['autopsy.run'] = true, ['experiment'] = true, ['patching.run'] = true, ['help'] = true,
  ['torch.set_num_threads'] = true, ['native.blocks.with_trusted_ids'] = true, ['native.blocks.without_init'] = true,
  ['models.from_pretrained'] = true, ['data.text'] = true,
  ['torch.repl'] = true, ['native.repl'] = true, ['torch.distributed'] = true, ['native.dist'] = true,
}
local function skipped(name)
  for prefix, on in pairs(skip) do
    if on and (name == prefix or name:sub(1, #prefix + 1) == prefix .. '.') then return true end
  end
  return name:find('save') ~= nil or name:find('write') ~= nil or name:find('report') ~= nil or name:find('json') ~= nil
    or name:find('exit') ~= nil or name:find('sleep') ~= nil or name:find('interrupt') ~= nil
end

-- the functions, by name
local fns, names = {}, {}
local function add(name, f)
  if type(f) == 'function' and not skipped(name) and not fns[name] then
    fns[name] = f
    names[#names + 1] = name
  end
end
local function walk(prefix, t, depth, seen)
  if depth > 2 or seen[t] then return end
  seen[t] = true
  for k, v in pairs(t) do
    if type(k) == 'string' and not k:match('^__') then
      local name = prefix .. '.' .. k
      if type(v) == 'function' then add(name, v)
      elseif type(v) == 'table' and getmetatable(v) == nil then walk(name, v, depth + 1, seen) end
    end
  end
end
for _, root in ipairs{'torch', 'nn', 'optim', 'probe', 'patching', 'data', 'train', 'text', 'models', 'autopsy', 'exact'} do
  walk(root, _G[root], 0, {})
end
walk('native', native, 0, {})  -- the library's own natives (anatomy.torch.native), once torch._*
-- Every function reachable from the metatables of the objects the library
-- makes, metamethods included (__tostring, __gc, __index's methods, the
-- operators), read with debug.getmetatable past any __metatable guard: a C
-- function there may be called with any argument by anyone. One object of
-- each kind is made here, before the first call, so the list is the same for
-- every seed and every --only subset.
local function add_metatable(label, v, seen)
  local mt = debug.getmetatable(v)
  if type(mt) ~= 'table' or seen[mt] then return end
  seen[mt] = true
  for k, f in pairs(mt) do
    if type(k) == 'string' then
      local name = ('getmetatable(%s).%s'):format(label, k)
      if type(f) == 'function' then add(name, f)
      elseif type(f) == 'table' then
        walk(name, f, 1, {})
        add_metatable(name, f, seen)
      end
    end
  end
end
do
  local seen = {}
  local ok_model, model = pcall(models.gpt, {vocab = 7, dim = 8, heads = 2, layers = 1, seq = 4, ffn = 8})
  local samples = {
    {'tensor', torch.ones(2)}, {'size', torch.ones(2, 3):size()}, {'rational', exact.Q('3/2')},
    {'corpus', data.from_string(('abc def '):rep(20))}, {'model', ok_model and model or nil},
  }
  if ok_model then
    for name, m in model:named_modules() do samples[#samples + 1] = {'module ' .. (name == '' and 'model' or name), m} end
    samples[#samples + 1] = {'optimizer', optim.AdamW(model:parameters(), {lr = 1e-3})}
    local ok, _, cache = pcall(probe.run_with_cache, model, torch.tensor({{1, 2}}, {dtype = 'int64'}))
    if ok then samples[#samples + 1] = {'cache', cache} end
  end
  for _, s in ipairs(samples) do if s[2] ~= nil then add_metatable(s[1], s[2], seen) end end
end

local tensor_methods = {}
for k, v in pairs(torch.Tensor) do
  if type(k) == 'string' and type(v) == 'function' and not skipped('Tensor.' .. k) then tensor_methods[#tensor_methods + 1] = k end
end
-- the operators, on whatever the pool gives (tensors, numbers, rationals, tables)
local operators = {
  ['a + b'] = function(a, b) return a + b end, ['a - b'] = function(a, b) return a - b end,
  ['a * b'] = function(a, b) return a * b end, ['a / b'] = function(a, b) return a / b end,
  ['a % b'] = function(a, b) return a % b end, ['a ^ b'] = function(a, b) return a ^ b end,
  ['-a'] = function(a) return -a end, ['a == b'] = function(a, b) return a == b end,
  ['a < b'] = function(a, b) return a < b end, ['a <= b'] = function(a, b) return a <= b end,
  ['#a'] = function(a) return #a end, ['a .. b'] = function(a, b) return a .. b end,
  ['a[b]'] = function(a, b) return a[b] end, ['a[b] = c'] = function(a, b, c) a[b] = c end,
  ['tostring(a)'] = function(a) return tostring(a) end, ['a(b, c)'] = function(a, b, c) return a(b, c) end,
}
for name, f in pairs(operators) do add('operator ' .. name, f) end
table.sort(names)
table.sort(tensor_methods)

-- the pool of arguments
local scratch = os.tmpname()
os.remove(scratch)
os.execute("mkdir -p '" .. scratch .. "'")
local function tensors()
  local t = {
    torch.randn(3, 4), torch.zeros(0), torch.tensor(2.5), torch.ones(2, 3):t(), torch.randn(4):expand(3, 4),
    torch.arange(6):long(), torch.tensor({1, -1, 0}):int(), torch.ones(3):bool(), torch.randn(2, 2):to('float16'),
    torch.randn(2, 2):double(), torch.tensor({0 / 0, 1 / 0, -1 / 0}), torch.tensor({9007199254740993}, {dtype = 'int64'}),
    torch.randint(1, 5, {2, 3}), torch.randn(1, 1, 1, 1), torch.zeros(2, 0, 3), torch.randn(5, 5):narrow(2, 2, 2),
  }
  t[#t + 1] = torch.randn(3, 3):requires_grad_()
  return t
end
local pool_tensors = tensors()
local cyclic = {}
cyclic[1] = cyclic
cyclic.self = cyclic
local deep = {}
do local d = deep for _ = 1, 200 do d[1] = {} d = d[1] end end
local rationals = {exact.Q('3/2'), exact.Q(-7), exact.Q('1/1000000007'), exact.Q(0)}
local scalars = {0, -1, 1, 2, 3, 0.5, -0.5, 2 ^ 53, -2 ^ 53, 2 ^ 63, 2 ^ 64, 1e12, 1e308, 0 / 0, 1 / 0, -1 / 0, 7, 1000000}
local strings = {'', 'x', ('a'):rep(10000), '\255\254\253', 'float32', 'int64', 'cpu', 'cuda', 'mean', 'sum', 'relu',
  scratch .. '/missing', scratch .. '/no/such/file', scratch .. '/out.bin', '*', 'blocks.1', 'gelu', 'bfloat16', '3/2'}
local results = {}  -- values earlier calls returned
-- the count options the library takes, each given alone with a number from
-- scalars (0, -1, 0.5, nan, inf, ...): each must be refused or used, never
-- loop without end
local count_options = {'batch', 'batches', 'steps', 'seq', 'every', 'k', 'top_k', 'max_new', 'log_every', 'eval_every',
  'eval_batches', 'warmup', 'streams', 'iters', 'n', 'context', 'after'}
-- the pool models' 7 tokens; its val split (4 tokens) fits in one window of
-- their context (4), where train.evaluate's loop is the one its batch steps
local corpus_text = ('abc def '):rep(5)
local pool_corpus = data.from_string(corpus_text)

local function module_pool()
  local ok, m = pcall(function() return models.gpt{vocab = 7, dim = 8, heads = 2, layers = 1, seq = 4, ffn = 8} end)
  return ok and m or nil
end
local pool_model = module_pool()

-- models whose probes misbehave: a hook that raises, one that returns a
-- tensor of the wrong shape, one that calls the model again from inside its
-- own forward (re-entrant, once), and one that calls it without end (the
-- recursion runs through the C++ blocks, so it must stop at the C stack's
-- limit with an error)
local hooked = {}
do
  local points = pool_model and probe.names(pool_model) or {}
  local x = torch.tensor({{1, 2, 3}}, {dtype = 'int64'})
  local function with(fn)
    local m = module_pool()
    if m and #points > 0 then
      local point = points[math.random(#points)]
      if pcall(probe.replace, m, point, function(t) return fn(m, t) end) then hooked[#hooked + 1] = m end
    end
  end
  with(function() error('an error from a hook') end)
  with(function(_, t) return torch.is_tensor(t) and t:reshape(-1) or t end)
  local inside = false
  with(function(m, t)
    if not inside then inside = true; pcall(m, x); inside = false end
    return t
  end)
  with(function(m, t) m(x); return t end)
  -- and called as models are: on token ids, with or without the grad
  if #hooked > 0 then
    fns['hooked_model(ids)'] = function(grad)
      local m = hooked[math.random(#hooked)]
      if grad then return m(x):sum():backward() end
      return torch.no_grad(function() return m(x) end)
    end
    names[#names + 1] = 'hooked_model(ids)'
  end
end

local function pick(list) return list[math.random(#list)] end
local function arg_value(depth)
  local r = math.random(100)
  if r <= 30 then return pick(pool_tensors)
  elseif r <= 48 then return pick(scalars)
  elseif r <= 50 then return pick(rationals)
  elseif r <= 60 then return pick(strings)
  elseif r <= 64 then return nil
  elseif r <= 68 then return math.random(2) == 1
  elseif r <= 72 then return {}
  elseif r <= 76 then return {pick(scalars), pick(scalars)}
  elseif r <= 78 then return cyclic
  elseif r <= 79 then return deep
  elseif r <= 82 then return function() error('an error from a callback') end
  elseif r <= 83 then return function(x) return x end
  elseif r <= 84 then return function() coroutine.yield() end
  elseif r <= 85 and pool_model then return pool_model
  elseif r <= 86 then return pool_corpus
  elseif r <= 88 and #hooked > 0 then return pick(hooked)
  elseif r <= 92 and #results > 0 then return pick(results)
  elseif r <= 94 and depth < 2 then return {dtype = pick(strings), dim = pick(scalars), keepdim = true, [1] = arg_value(depth + 1)}
  elseif r <= 96 then return {[pick(count_options)] = pick(scalars)}  -- {batch = 0}: train.evaluate's loop stepped by 0
  end
  return pick(scalars)
end

local log = cfg.log ~= '' and assert(io.open(cfg.log, 'w')) or nil
local function describe(v)
  if torch.is_tensor(v) then return ('Tensor(%s, %s)'):format(table.concat(v:size(), 'x'), v.dtype) end
  if type(v) == 'string' then return ('%q'):format(#v > 40 and v:sub(1, 40) .. '...' or v) end
  if type(v) == 'table' or type(v) == 'userdata' then
    local mt = getmetatable(v)
    return ('%s %s'):format(type(v), type(mt) == 'table' and rawget(mt, '__typename') or '')
  end
  return tostring(v)
end

-- pcall inside a coroutine: a callback that yields leaves the coroutine
-- (through the C++ caller when there is one: that must be an error)
local function coroutine_pcall(f)
  local co = coroutine.create(function() return pcall(f) end)
  local ok, pok, r = coroutine.resume(co)
  if not ok then return false, pok end
  if coroutine.status(co) == 'suspended' then return true, nil end  -- it yielded from Lua: fine, dropped
  return pok, r
end

-- resident memory, to find growth without bound (the rule: across 10^4 calls)
local function rss_mib()
  local f = io.open('/proc/self/statm')
  if not f then return 0 end
  local pages = tonumber(f:read('*a'):match('^%d+%s+(%d+)'))
  f:close()
  return (pages or 0) * 4096 / 2 ^ 20
end
local rss = {}

-- a call that runs longer than this is a finding (a hang that ends); one
-- that never ends is stopped by scripts/fuzz's timeout, the log naming it.
-- (scripts/fuzz caps one allocation at 512 MiB, ANATOMY_MAX_ALLOCATION, so
-- that filling a huge tensor under ASan is not what takes the time)
local slow_bound = 30

local calls, errors, bad, findings = 0, 0, 0, 0
local started = native.now()

-- First, the count options on their own, in order: every function of the
-- analysis roots called as f(model, corpus, {key = v}) for each count option
-- and each value a count must refuse (train.evaluate{batch = 0} looped
-- forever; the random calls below draw that combination too rarely). Each
-- call is logged as 'counts ...' before it runs; an error is expected, a
-- slow call is a finding.
if pool_model and not only then
  local refused = {0, -1, 0.5, 0 / 0, 1 / 0}
  for _, name in ipairs(names) do
    local root = name:match('^[^.]+')
    if root == 'train' or root == 'autopsy' or root == 'probe' or root == 'patching' or root == 'data' then
      for _, key in ipairs(count_options) do
        for _, v in ipairs(refused) do
          if log then log:write(('counts %s(model, corpus, {%s = %s})\n'):format(name, key, tostring(v))); log:flush() end
          -- a fresh corpus, and the model without what an earlier call attached
          -- (probe.skip, probe.replace): the count is what is refused
          probe.clear(pool_model)
          local corpus = data.from_string(corpus_text)
          local t0 = native.now()
          local ok, r = pcall(fns[name], pool_model, corpus, {[key] = v})
          if native.now() - t0 > slow_bound then
            findings = findings + 1
            print(('FINDING: %s(model, corpus, {%s = %s}) took %.1f s (the bound is %d s)'):format(name, key, tostring(v),
              native.now() - t0, slow_bound))
          end
          if not ok and (r == nil or r == '') then
            bad = bad + 1
            print(('FINDING: %s(model, corpus, {%s = %s}) raised an error without a message'):format(name, key, tostring(v)))
          end
        end
      end
    end
  end
  probe.clear(pool_model)  -- what a call attached stays out of the random calls' model
end
for i = 1, cfg.calls do
  math.randomseed(seed * 1000003 + i)
  local on_tensor = math.random(3) == 1
  local name, f
  if on_tensor then
    name = 'Tensor:' .. pick(tensor_methods)
  else
    name = pick(names)
    f = fns[name]
  end
  local nargs = math.random(0, 4)
  local args = {}
  for a = 1, nargs do args[a] = arg_value(0) end
  local self
  if on_tensor then self = math.random(5) == 1 and arg_value(0) or pick(pool_tensors) end
  if log and (not only or only[i]) then
    local parts = {}
    for a = 1, nargs do parts[a] = describe(args[a]) end
    log:write(('%d %s(%s%s)\n'):format(i, name, on_tensor and describe(self) .. (nargs > 0 and ', ' or '') or '', table.concat(parts, ', ')))
    log:flush()
  end
  local call_started = native.now()
  local ok, r = true, nil
  local in_coroutine = math.random(20) == 1  -- so a callback's yield has a coroutine to leave
  if not only or only[i] then ok, r = (in_coroutine and coroutine_pcall or pcall)(function()
    if on_tensor then
      local m = torch.is_tensor(self) and self[name:sub(8)] or nil
      if type(m) ~= 'function' then error('not a method of this value') end
      return m(self, unpack(args, 1, nargs))
    end
    return f(unpack(args, 1, nargs))
  end)
  calls = calls + 1
  end
  local took = native.now() - call_started
  if took > slow_bound then
    findings = findings + 1
    print(('FINDING: call %d, %s, took %.1f s (the bound is %d s; seed %d)'):format(i, name, took, slow_bound, seed))
  end
  if not ok then
    errors = errors + 1
    if r == nil or (type(r) == 'string' and r == '') then
      bad = bad + 1
      print(('FINDING: call %d, %s, raised an error without a message (seed %d)'):format(i, name, seed))
    end
  elseif r ~= nil and #results < 200 and (torch.is_tensor(r) or type(r) == 'table' or type(r) == 'userdata') then
    if not (torch.is_tensor(r) and r:numel() > 1e6) then results[#results + 1] = r end
  end
  if i % 10000 == 0 then
    collectgarbage()
    collectgarbage()
    rss[#rss + 1] = rss_mib()
  end
  if i % 500 == 0 then
    collectgarbage()
    torch.manual_seed(seed * 1000003 + i)
    pool_tensors = tensors()  -- in-place calls may have changed them
    if #results > 100 then results = {} end
  end
  if cfg.verbose and i % 10000 == 0 then print(('%d calls, %d errors, resident memory %.0f MiB'):format(i, errors, rss_mib())) end
end
os.execute("rm -rf '" .. scratch .. "'")
-- growth without bound: after the first 10^4 calls (pools filling, ASan's
-- quarantine), every later block of 10^4 calls adds to the resident memory,
-- more than 256 MiB in all
local grew = false
if #rss >= 4 then
  grew = rss[#rss] - rss[1] > 256
  for k = 2, #rss do if rss[k] <= rss[k - 1] then grew = false end end
end
if grew then
  findings = findings + 1
  print(('FINDING: resident memory grew at every 10^4 calls, from %.0f MiB to %.0f MiB (seed %d)'):format(rss[1], rss[#rss], seed))
end
print(('lua_api: %d functions and %d tensor methods; %d calls (seed %d), %d Lua errors, %d without a message, %.1f s, resident memory %.0f..%.0f MiB; the process survived'):format(
  #names, #tensor_methods, calls, seed, errors, bad, native.now() - started, rss[1] or rss_mib(), rss[#rss] or rss_mib()))
os.exit((bad == 0 and findings == 0) and 0 or 1)
