-- torch.cuda, CUDA graphs and the GPU paths of training. Without a GPU (or
-- without a CUDA build) the calls must refuse with errors that say which; the
-- GPU tests skip, naming what is missing. With one (scripts/gpu-check) they run:
-- CUDA graphs (with probe steps outside them), bf16 against float32 over 200
-- steps, and a GPU model under a CPU default device against the same on the CPU.
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
  local host = torch.zeros(2, {device = 'cpu'})  -- pinning is of CPU memory, whatever the default device
  raises(function() host:pin_memory() end, 'pin_memory: pinned memory needs a GPU, and none is visible')
  eq(host:is_pinned(), false)
  raises(function() torch.zeros(2):to('cuda') end, "bad argument #1 to 'to' (device 'cuda' is not available: this LibTorch has no CUDA, or no GPU is visible)")
  raises(function() torch.cuda.side_stream(function() end) end, "error in 'cuda.side_stream' (" .. reason .. ')')
  raises(function() torch.cuda.side_stream(42) end, "bad argument #1 to 'cuda.side_stream' (function expected, got number)")
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

test('beside a GPU, accel stays off: a backward on cuda works and pins memory, and device accel says why', function()
  need_gpu()
  -- a PrivateUse1 backend registered beside CUDA takes its place as LibTorch's
  -- accelerator: every backward then failed in the autograd engine's stream
  -- check, and pin_memory asked accel for a pinned allocator
  local w = torch.randn(3, 3, {device = 'cuda', requires_grad = true})
  w:mul(2):sum():backward()
  close(w.grad, torch.full({3, 3}, 2.0, {device = 'cuda'}), 0)
  local host = torch.zeros(4, {device = 'cpu'}):pin_memory()
  eq(host:is_pinned(), true)
  H.raises_part(function() torch.zeros(2, {device = 'accel'}) end, 'this machine has a CUDA device, and accel stands in for one only where there is none')
end)

test('device argument checks', function()
  raises(function() torch.cuda.synchronize('tpu') end, "bad argument #1 to 'cuda.synchronize' (expected a CUDA device ('cuda' or 'cuda:N') or its index, got 'tpu')")
  raises(function() torch.cuda.memory_allocated(-1) end, "bad argument #1 to 'cuda.memory_allocated' (device index must be >= 0, got -1)")
end)

-- ---- on a GPU ----------------------------------------------------------------

test('memory counters follow an allocation', function()
  need_gpu()
  collectgarbage()  -- tensors earlier tests left to the collector go now, not
  collectgarbage()  -- between the two readings (5120 bytes did on an H200)
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

-- What f() returns, computed while g captures it: g records the kernels f runs.
local function captured(g, f)
  g:capture_begin()
  local y = f()
  g:capture_end()
  return y
end

test('a CUDA graph replays its kernels on new input', function()
  need_gpu()
  local x = torch.zeros(4, {device = 'cuda'})
  local g = torch.cuda.CUDAGraph()
  local y = captured(g, function() return x * 2 + 1 end)
  x:copy_(torch.tensor({1, 2, 3, 4}))
  g:replay()
  eq(y:cpu():tolist(), {3, 5, 7, 9})
  x:fill_(10)
  g:replay()
  eq(y:cpu():tolist(), {21, 21, 21, 21})
  H.raises_part(function() g:capture_end() end, 'CUDAGraph:capture_end: no capture under way')
end)

test('a capture that fails is abandoned cleanly: random numbers and a new capture work afterwards', function()
  need_gpu()
  local x = torch.ones(4, {device = 'cuda'})
  local g = torch.cuda.CUDAGraph()
  g:capture_begin()
  eq(g:capturing(), true)
  local ok = pcall(function() return (x * 2):sum():item() end)  -- a read back to the host cannot be captured
  eq(ok, false, 'item() inside a capture fails')
  H.raises_part(function() g:capture_end() end, 'capture')  -- CUDA's reason; the capture is then reset
  eq(g:capturing(), false)
  eq(torch.rand(3, {device = 'cuda'}):size(), {3}, 'the generator left capture mode')
  local y = captured(g, function() return x * 3 + torch.rand(4, {device = 'cuda'}) * 0 end)
  g:replay()
  eq(y:cpu():tolist(), {3, 3, 3, 3}, 'a new capture on the same graph object replays')
end)

test('side_stream runs a function off the legacy stream and waits for it', function()
  need_gpu()
  local x = torch.zeros(1024, {device = 'cuda'})
  local a, b = torch.cuda.side_stream(function(k) x:add_(k) return 'done', k end, 2)
  eq({a, b}, {'done', 2}, 'its values')
  eq(x:sum():item(), 2048, 'the work done on the side stream is seen after it')
  H.raises_part(function() torch.cuda.side_stream(function() error('inside') end) end, 'inside')
  eq((x + 1):sum():item(), 3072, 'the stream is restored after an error')
end)

-- A small GPT trained `steps` steps, with the step in a CUDA graph or not;
-- extra: more train.fit options
local function graph_run(graph, steps, extra)
  local c = data.from_string(('to be or not to be, that is the question. '):rep(40))
  torch.manual_seed(3)
  local m = models.gpt{vocab = c.vocab_size, dim = 32, heads = 2, layers = 2, seq = 16, ffn = 64}
  local o = {steps = steps, batch = 8, lr = 3e-3, seed = 3, quiet = true, cuda_graph = graph, eval_every = 1000}
  for k, v in pairs(extra or {}) do o[k] = v end
  return train.fit(m, c, o)
end

test('train.fit cuda_graph = true follows the eager run', function()
  need_gpu()
  local eager, graphed = graph_run(false, 30), graph_run(true, 30)
  for i = 1, 30 do close(graphed.train[i], eager.train[i], 1e-3, 'loss at step ' .. i) end
end)

test('bf16 on the GPU: 200 steps follow float32 within 0.03 nats (GPT and VibeNet)', function()
  need_gpu()
  -- Tolerance: on the CPU (test_train) bf16's last-10 mean differs from
  -- float32's by ~3e-4 nats over 100 steps; 0.03 over 200 steps on the GPU
  -- fails a broken cast, a loss computed in bf16 or a model that stopped
  -- learning, not rounding. The largest differences are printed.
  local c = data.from_string(('to be or not to be, that is the question; whether tis nobler in the mind to suffer. '):rep(80))
  for name, make in pairs{
    gpt = function() return models.gpt{vocab = c.vocab_size, dim = 64, heads = 4, layers = 2, seq = 32, ffn = 256} end,
    vibenet = function() return models.vibenet{vocab = c.vocab_size, dim = 64, layers = 2, seq = 32, block = 'ffn'} end,
  } do
    local f32, bf16 = H.fit_f32_bf16(make, c, 200, 7)
    local function tail(r) local t = 0 for i = 181, 200 do t = t + r.train[i] end return t / 20 end
    print(('  %s: first loss %.5f (bf16) against %.5f; mean of the last 20 %.5f against %.5f'):format(
      name, bf16.train[1], f32.train[1], tail(bf16), tail(f32)))
    close(bf16.train[1], f32.train[1], 0.01, name .. ': first loss')
    close(tail(bf16), tail(f32), 0.03, name .. ': mean of the last 20 losses')
    assert(tail(bf16) < f32.train[1] - 1, name .. ': the bf16 run learned')
  end
end)

test('a CUDA graph with probes every 10 steps: the probe steps run outside it, the losses follow the eager run', function()
  need_gpu()
  local eager, graphed = graph_run(false, 40, {probe = {every = 10}}), graph_run(true, 40, {probe = {every = 10}})
  for i = 1, 40 do close(graphed.train[i], eager.train[i], 1e-3, 'loss at step ' .. i) end
  local steps = {}
  for i, r in ipairs(graphed.probes) do steps[i] = r.step end
  eq(steps, {1, 10, 20, 30, 40}, 'the probe steps')
  for i, r in ipairs(graphed.probes) do
    for name, v in pairs(r.grad_norm) do
      close(v, eager.probes[i].grad_norm[name], 1e-3 * math.max(1, math.abs(v)), ('step %d: grad norm of %s'):format(r.step, name))
    end
  end
end)

test('a model moved to the GPU under a CPU default device: training, probes, lens, SAE and autopsy as on the CPU', function()
  need_gpu()
  -- The class of bug where a tensor is made on the CPU (or the default
  -- device) and mixed with a GPU model's: tests/lua/test_device.lua catches
  -- the default-device half on the CPU; this half needs a GPU.
  local home = torch.device()
  torch.set_default_device('cpu')
  local ok, err = pcall(function()
    local c = data.from_string(('the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs. '):rep(40))
    local function make()
      torch.manual_seed(2)
      return models.gpt{vocab = c.vocab_size, dim = 32, heads = 2, layers = 2, seq = 16, ffn = 64, norm = 'pre'}
    end
    local cpu_model, gpu_model = make(), make():to('cuda')
    eq(gpu_model:device():match('^cuda') ~= nil, true, 'the model is on the GPU')
    local a = train.fit(cpu_model, c, {steps = 10, batch = 4, seq = 16, seed = 1, quiet = true, eval_every = 5, eval_batches = 2})
    local b = train.fit(gpu_model, c, {steps = 10, batch = 4, seq = 16, seed = 1, quiet = true, eval_every = 5, eval_batches = 2})
    for i = 1, 10 do close(b.train[i], a.train[i], 1e-3, 'loss at step ' .. i) end
    cpu_model:eval(); gpu_model:eval()
    local texts = {'the fox', 'pack my box with'}
    local _, ca = probe.run_with_cache(cpu_model, texts, {tokenizer = c})
    local _, cb = probe.run_with_cache(gpu_model, texts, {tokenizer = c})
    for _, n in ipairs(ca:names()) do
      assert(cb[n].device:match('^cuda'), n .. ' is cached on ' .. cb[n].device)
      local got, want = cb[n]:cpu(), ca[n]  -- scores hold -inf where masked: the same places, the rest close
      eq(got:isinf():eq(want:isinf()):all():item(), true, n .. ': -inf in the same places')
      close(got:masked_fill(got:isinf(), 0), want:masked_fill(want:isinf(), 0), 1e-3, n)
    end
    local x = c:encode('the quick brown'):unsqueeze(1)
    local x2 = c:encode('pack my box with fiv'):narrow(1, 1, x:size(2)):unsqueeze(1)
    local metric = function(l) return l[{{}, -1, 3}]:sum() end
    close(patching.attribute(gpu_model, x, x2, metric, {over = 'attn.k', per = 'head', method = 'atp-qk'}).grid,
      patching.attribute(cpu_model, x, x2, metric, {over = 'attn.k', per = 'head', method = 'atp-qk'}).grid, 1e-4, 'AtP with the QK fix')
    close(lens.logit(gpu_model):evaluate(x).kl[2], lens.logit(cpu_model):evaluate(x).kl[2], 1e-4, 'logit lens')
    local heads_a = probe.detect_heads(cpu_model, x, 'previous_token')
    local heads_b = probe.detect_heads(gpu_model, x, 'previous_token')
    close(heads_b.scores, heads_a.scores, 1e-4, 'head detectors')
    local s = sae.train(gpu_model, c, {point = 'blocks.1.resid_post', steps = 5, batch = 64, width = 32, seq = 16, sequences = 4, quiet = true})
    assert(s.W_enc.device:match('^cuda'), 'the SAE trains on the GPU')
    -- the same SAE judged on the GPU model and, copied, on the CPU one
    local on_gpu = sae.evaluate(gpu_model, s, c, {batches = 2, batch = 4, seq = 16})
    local s_cpu = sae.new{d_in = 32, d_sae = 32, kind = s.cfg.kind, k = s.cfg.k}
    s_cpu:load_state_dict(s:state_dict())
    local on_cpu = sae.evaluate(cpu_model, s_cpu, c, {batches = 2, batch = 4, seq = 16, point = 'blocks.1.resid_post'})
    close(on_gpu.explained_variance, on_cpu.explained_variance, 1e-3, 'SAE explained variance')
    close(on_gpu.l0, on_cpu.l0, 1e-3, 'SAE L0')
    torch.manual_seed(5)
    local ra = autopsy.run(cpu_model, c, {batch = 2, seq = 16, steps = 1})
    torch.manual_seed(5)
    local rb = autopsy.run(gpu_model, c, {batch = 2, seq = 16, steps = 1})
    eq(#rb.rows, #ra.rows, 'autopsy rows')
    for i, row in ipairs(ra.rows) do
      if row.act_std then close(rb.rows[i].act_std, row.act_std, 1e-3 * math.max(1, row.act_std), row.name .. ': activation std') end
    end
    print(('  GPU against CPU: largest loss difference over 10 steps %.2g'):format((function()
      local d = 0 for i = 1, 10 do d = math.max(d, math.abs(b.train[i] - a.train[i])) end return d end)()))
  end)
  torch.set_default_device(home)
  if not ok then error(err, 0) end
end)

H.done()
