-- What the benchmarks' Lua halves share: the clock, a run of timed calls
-- summarised by its median, and writing the result. Loaded by
-- bench/bench.lua and bench/ab.lua, which scripts/ab also runs on older
-- builds: the clock is read where each keeps it (anatomy.torch.native.now,
-- torch._now before).
local timing = {}

local ok, native = pcall(require, 'anatomy.torch.native')
timing.now = ok and native.now or rawget(torch, '_now')

-- timing.summary(times) -> {median, min, max, n, times}
function timing.summary(times)
  local sorted = {}
  for i, t in ipairs(times) do sorted[i] = t end
  table.sort(sorted)
  local n = #sorted
  local median = n % 2 == 1 and sorted[(n + 1) / 2] or (sorted[n / 2] + sorted[n / 2 + 1]) / 2
  return {median = median, min = sorted[1], max = sorted[n], n = n, times = times}
end

-- timing.steps(n, warmup, fn) -> the summary of n timed calls of fn() after warmup untimed ones
function timing.steps(n, warmup, fn)
  for _ = 1, warmup do fn() end
  local times = {}
  for i = 1, n do
    local t0 = timing.now()
    fn()
    times[i] = timing.now() - t0
  end
  return timing.summary(times)
end

-- timing.write(out, text): text and a newline to the file out, or to stdout when out is ''
function timing.write(out, text)
  if out == '' then
    print(text)
    return
  end
  local f = assert(io.open(out, 'w'))
  f:write(text, '\n')
  f:close()
end

return timing
