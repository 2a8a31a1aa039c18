-- Peak memory and time of sae.attribute on a GPT-2-small-sized model (12
-- layers, d_model 768, 12 heads, GPT-2's vocabulary of 50257; random
-- weights) with a 16k-feature-per-layer JumpReLU cross-layer transcoder,
-- its thresholds set so that about 64 features a token a layer are active.
--   anatomy bench/graph_memory.lua OUT.json T [MAX_FEATURE_NODES BATCH_SIZE MAX_N_LOGITS F]
-- OUT.json: the config, the active features (L0 a token a layer), the
-- process's resident memory before sae.attribute and its peak (VmRSS,
-- VmHWM from /proc/self/status), the seconds sae.attribute took, and the
-- CPU. docs/graphs.md ("Memory") reads them.
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')
local native = require('anatomy.torch.native')
local pretrained = require('anatomy.models.pretrained')
local splice = require('anatomy.features.clt_splice')
local hooks = require('anatomy.probe.hooks')

-- anatomy bench/graph_memory.lua formula [MAX_FEATURE_NODES BATCH_SIZE]: the terms of docs/graphs.md's formula for
-- this config at 2k and 8k tokens (L0 64, 10 logits), in GB, before and after the chunked attribution
if arg[1] == 'formula' then
  local L, H, D, F, K = 12, 12, 768, 16384, 10
  local M, B = tonumber(arg[2] or 1024), tonumber(arg[3] or 8)
  local W = L * (L + 1) / 2  -- a CLT's decoder widths summed over layers
  local rows = {}
  for _, T in ipairs{2048, 8192} do
    local n = 64 * L * (T - 1)
    local N, S = n + (L + 1) * T + K, M + (L + 1) * T + K
    local gb = function(floats) return floats * 4 / 1e9 end
    rows[#rows + 1] = {T = T, n_active = n, N = N, S = S,
      dense_features = gb(L * T * F), writes = gb(n / L * W * D), patterns = gb(B * L * H * T * T),
      row_buffer = gb((M + K) * N), kept_rows = gb((M + K) * S), dense_adjacency = gb(S * S),
      batch_pattern_one_layer = gb(B * H * T * T), errors = gb(L * T * D), feature_lists = n * 48 / 1e9}
  end
  print(require('anatomy.io.json').encode({max_feature_nodes = M, batch_size = B, L = L, H = H, D = D, F = F, K = K,
    terms_gb = rows}))
  return
end

local out, T = arg[1], tonumber(arg[2])
local max_f, B, K, F = tonumber(arg[3] or 16), tonumber(arg[4] or 4), tonumber(arg[5] or 4), tonumber(arg[6] or 16384)
assert(out and T, 'usage: anatomy bench/graph_memory.lua OUT.json T [MAX_FEATURE_NODES BATCH_SIZE MAX_N_LOGITS F]')
local L, D, L0 = 12, 768, 64

local function status(key)  -- kB
  for line in io.lines('/proc/self/status') do
    local v = line:match('^' .. key .. ':%s+(%d+)')
    if v then return tonumber(v) * 1024 end
  end
end

local function cpu()
  local p = io.popen('lscpu')
  local s = p:read('*a')
  p:close()
  return s:match('Model name:%s+([^\n]+)')
end

torch.manual_seed(0)
local Fam = require(pretrained.families.gpt2)
local model = Fam.build(Fam.check({model_type = 'gpt2', vocab_size = 50257, n_positions = math.max(T, 1024), n_embd = D,
  n_layer = L, n_head = 12}, 'bench'))
model:eval()
local c = sae.clt{n_layers = L, d_model = D, d_transcoder = F, kind = 'jumprelu', input_hook = 'mlp.hook_in',
  output_hook = 'mlp.hook_out'}
local ids = torch.randint(1, 50258, {T}):long()
ids[1] = 50257  -- GPT-2's <|endoftext|> (anatomy's ids from 1) as the BOS

-- thresholds: each layer's the (L0 · S)-th largest pre-activation over S positions of the prompt
local S = math.min(T - 1, 256)
local locs = splice.locations(model, c, 'bench', 1)
local xs, hs = {}, {}
for l, loc in ipairs(locs) do
  hs[#hs + 1] = hooks.replace(model, loc.input, function(t, _, input)
    xs[l] = (loc.from_module_input and input or t)[1]:narrow(1, 2, S):clone()
  end)
end
torch.no_grad(function()
  hooks.with(hooks.group(hs), function() model(ids:narrow(1, 1, S + 1):view(1, -1)) end)
  for l = 1, L do
    local pre = xs[l]:matmul(c.W_enc:select(1, l):t()) + c.b_enc:select(1, l)
    local top = pre:reshape(-1):topk(L0 * S)  -- the values
    c.threshold:select(1, l):fill_(top:min():item())
  end
end)
xs = nil
collectgarbage()

local result = {T = T, n_layers = L, d_model = D, n_heads = 12, vocab = 50257, d_transcoder = F, max_feature_nodes = max_f,
  batch_size = B, max_n_logits = K, threads = torch.get_num_threads(), libtorch = torch.__version__, cpu = cpu(),
  model_parameters = model:num_parameters(), clt_parameters = 0}
for _, p in ipairs(c:parameters()) do result.clt_parameters = result.clt_parameters + p:numel() end
result.rss_before_bytes = status('VmRSS')
local t0 = native.now()
-- each step of sae.attribute (graph.lua's nodes, backward, rows, partial_influences) as it starts, with the peak so far,
-- on stderr: where the peak is reached, for a run that is stopped before it ends
local steps = {nodes = true, backward = true, rows = true, partial_influences = true}
debug.sethook(function()
  local info = debug.getinfo(2, 'Sn')
  if info and steps[info.name] and info.short_src:match('features/graph%.lua$') then
    io.stderr:write(('%8.1f s  %-18s peak %.2f GB\n'):format(native.now() - t0, info.name, status('VmHWM') / 1e9))
  end
end, 'c')
local g = sae.attribute(model, c, ids, {max_feature_nodes = max_f, batch_size = B, max_n_logits = K})
result.seconds = native.now() - t0
debug.sethook()
result.peak_bytes = status('VmHWM')
result.active_features = g.active_features:size(1)
result.l0 = result.active_features / (L * (T - 1))
result.logits = g.logit_tokens:size(1)
result.nodes = g.adjacency_rows:size(2)  -- the dense (N, N) g.adjacency_matrix is not made here
result.adjacency_rows = g.adjacency_rows:size(1)
result.adjacency_nonzero = g.adjacency_rows:ne(0):sum():item()
local provenance = require('anatomy.io.provenance')
local machine = provenance.machine()
local loadavg = io.open('/proc/loadavg')
result.commit, result.cpu, result.cores, result.os = provenance.commit(), machine.cpu, machine.cores, machine.os
result.libtorch = torch.__version__
result.load_average = loadavg and loadavg:read('*n')  -- the 1-minute load at the end: the cores are shared
if loadavg then loadavg:close() end
fs.write_atomic(out, json.encode(result))
print(json.encode(result))
