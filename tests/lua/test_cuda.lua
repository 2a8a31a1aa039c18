-- torch.cuda, CUDA graphs and the GPU paths of training. Without a GPU (or
-- without a CUDA build) the calls must refuse with errors that say which; the
-- GPU tests skip, naming what is missing. With one (scripts/gpu-check) they run.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, close, raises = H.test, H.eq, H.close, H.raises

local gpu = torch.cuda.is_available()
local why_not = torch.version.cuda and ('no GPU is visible (CUDA ' .. torch.version.cuda .. ' build)')
  or ('this build has no CUDA (LibTorch ' .. torch.__version__ .. ')')
local function need_gpu() if not gpu then H.skip(why_not) end end

test('versions: torch.version() and torch.__version__ are LibTorch\'s, torch.version.cuda the CUDA it was built with', function()
  eq(torch.version(), torch.libtorch_version)
  eq(tostring(torch.version), torch.libtorch_version)
  eq(torch.__version__, torch.libtorch_version)
  eq(torch.version.anatomy, '0.1.0')
  assert(torch.version.cuda == nil or torch.version.cuda:match('^%d+%.%d+$'), tostring(torch.version.cuda))
  assert(torch.banner():find('LibTorch ' .. torch.libtorch_version, 1, true), torch.banner())
end)

test('without a GPU, torch.cuda answers and refuses clearly', function()
  if gpu then H.skip('a GPU is visible') end
  eq(torch.cuda.is_available(), false)
  eq(torch.cuda.device_count(), 0)
  local reason = torch.version.cuda and ('no GPU is visible (this LibTorch has CUDA ' .. torch.version.cuda .. ', but no device answers)')
    or ('this anatomy was built against a LibTorch without CUDA (LibTorch ' .. torch.__version__ .. '); the CUDA build is made by scripts/setup --torch=cuda')
  for _, f in ipairs{'synchronize', 'memory_allocated', 'max_memory_allocated', 'memory_reserved', 'reset_peak_memory_stats', 'CUDAGraph'} do
    raises(function() torch.cuda[f]() end, "error in 'cuda." .. f .. "' (" .. reason .. ')')
  end
  raises(function() torch.zeros(2):pin_memory() end, 'pin_memory: pinned memory needs a GPU, and none is visible')
  eq(torch.zeros(2):is_pinned(), false)
  raises(function() torch.zeros(2):to('cuda') end, "bad argument #1 to 'to' (device 'cuda' is not available: this LibTorch has no CUDA, or no GPU is visible)")
end)

test('train.fit cuda_graph = true without a GPU is a clear error, and nothing trains', function()
  if gpu then H.skip('a GPU is visible') end
  local c = data.from_string(('to be or not to be, '):rep(30))
  torch.manual_seed(1)
  local m = models.gpt{vocab = c.vocab_size, dim = 16, heads = 2, layers = 1, seq = 16, ffn = 32}
  local before = m:parameters()[1]:clone()
  local expected = torch.version.cuda
    and ('train.fit: cuda_graph = true needs a GPU: this LibTorch has CUDA ' .. torch.version.cuda .. ', but no GPU is visible')
    or ('train.fit: cuda_graph = true needs a GPU: this anatomy is built against LibTorch ' .. torch.__version__ .. ' without CUDA (scripts/setup --torch=cuda builds the CUDA one)')
  raises(function() train.fit(m, c, {steps = 3, cuda_graph = true, quiet = true}) end, expected)
  raises(function() train.fit(m, c, {steps = 3, cuda_graph = 'yes', quiet = true}) end, 'train.fit: cuda_graph must be a boolean, got string')
  eq((m:parameters()[1] - before):abs():max():item(), 0, 'no step was taken')
end)

test('device argument checks', function()
  raises(function() torch.cuda.synchronize('tpu') end, "bad argument #1 to 'cuda.synchronize' (expected a CUDA device ('cuda' or 'cuda:N') or its index, got 'tpu')")
  raises(function() torch.cuda.memory_allocated(-1) end, "bad argument #1 to 'cuda.memory_allocated' (device index must be >= 0, got -1)")
end)

-- ---- on a GPU ----------------------------------------------------------------

test('memory counters follow an allocation', function()
  need_gpu()
  torch.cuda.synchronize()
  torch.cuda.reset_peak_memory_stats()
  local before = torch.cuda.memory_allocated()
  local t = torch.zeros(1024, 1024, {device = 'cuda'})  -- 4 MiB
  torch.cuda.synchronize()
  assert(torch.cuda.memory_allocated() - before >= 4 * 1024 * 1024, 'allocated grew by the tensor')
  assert(torch.cuda.max_memory_allocated() >= torch.cuda.memory_allocated(), 'peak >= current')
  assert(torch.cuda.memory_reserved() >= torch.cuda.memory_allocated(), 'reserved >= allocated')
  t = nil
  collectgarbage()
  collectgarbage()
  torch.cuda.synchronize()
  eq(torch.cuda.memory_allocated(), before, 'freed')
end)

test('a CUDA graph replays its kernels on new input', function()
  need_gpu()
  local x = torch.zeros(4, {device = 'cuda'})
  local g = torch.cuda.CUDAGraph()
  g:capture_begin()
  local y = x * 2 + 1
  g:capture_end()
  x:copy_(torch.tensor({1, 2, 3, 4}))
  g:replay()
  eq(y:cpu():tolist(), {3, 5, 7, 9})
  x:fill_(10)
  g:replay()
  eq(y:cpu():tolist(), {21, 21, 21, 21})
  raises(function() g:capture_end() end, 'no capture under way')
end)

test('train.fit cuda_graph = true follows the eager run', function()
  need_gpu()
  local c = data.from_string(('to be or not to be, that is the question. '):rep(40))
  local function run(graph)
    torch.manual_seed(3)
    local m = models.gpt{vocab = c.vocab_size, dim = 32, heads = 2, layers = 2, seq = 16, ffn = 64}
    return train.fit(m, c, {steps = 30, batch = 8, lr = 3e-3, seed = 3, quiet = true, cuda_graph = graph, eval_every = 1000})
  end
  local eager, graphed = run(false), run(true)
  for i = 1, 30 do close(graphed.train[i], eager.train[i], 1e-3, 'loss at step ' .. i) end
end)

H.done()
