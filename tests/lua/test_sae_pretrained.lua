-- sae.from_pretrained without a Hub: a huggingface_hub cache written here
-- by hand (refs/main and a snapshot of plain files, which offline reading
-- accepts) and a registry YAML naming its releases. Each format's numbers
-- against its formula written out with tensor operations (the parity test
-- compares them with SAELens and sparsify themselves); the errors: an
-- unknown release or id names the closest, an entry of a format anatomy does
-- not read, a file the repository lacks, offline without the cache, shapes
-- that disagree with the config, a Llama Scope SAE the registry gives no
-- scaling factor, Gemma Scope's attention SAEs, bad options; a transcoder
-- is placed on the MLP and refused where what it writes is not that
-- module's output; a skip transcoder saved and read back keeps its skip;
-- SAELens's own registry file reads, where build/venv-sae has one.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, close, raises_part = H.test, H.eq, H.close, H.raises_part
local fs = require('anatomy.io.fs')
local json = require('anatomy.io.json')

local D, F = 8, 20
local cache = H.tmpdir()
local commit = ('ab'):rep(20)

-- a repository's snapshot in the cache: files = {path = text or tensors},
-- at commit `at` (default `commit`) which the branch `ref` (main) names
local function repo(id, files, ref, at)
  at = at or commit
  local root = ('%s/models--%s'):format(cache, id:gsub('/', '--'))
  fs.mkdir(root .. '/refs')
  local f = assert(io.open(root .. '/refs/' .. (ref or 'main'), 'w')); f:write(at); f:close()
  for path, body in pairs(files) do
    local full = root .. '/snapshots/' .. at .. '/' .. path
    fs.mkdir(fs.dirname(full))
    if type(body) == 'string' then
      local out = assert(io.open(full, 'w')); out:write(body); out:close()
    elseif path:match('%.npz$') then torch.save_npz(full, body)
    else torch.save_safetensors(full, body) end
  end
end

torch.manual_seed(1)
local function r(...) return torch.randn(...) * 0.3 end
local W_enc, b_enc, W_dec, b_dec, threshold = r(D, F), r(F), r(F, D), r(D), torch.rand(F) * 0.3
local saved = sae.new{d_in = D, d_sae = F, kind = 'jumprelu', point = 'blocks.1.resid_post'}
torch.no_grad(function()
  for name, v in pairs{W_enc = W_enc, b_enc = b_enc, W_dec = W_dec, b_dec = b_dec, threshold = threshold} do saved[name]:copy_(v) end
end)
local folder = H.tmpdir()
saved:save(folder .. '/jr')
repo('tiny/saelens', {['saes/jr/cfg.json'] = H.read(folder .. '/jr/cfg.json'),
  ['saes/jr/sae_weights.safetensors'] = torch.load_safetensors(folder .. '/jr/sae_weights.safetensors'),
  -- cfg.json says 30 features, the weights hold 20
  ['saes/bad/cfg.json'] = H.read(folder .. '/jr/cfg.json'):gsub('"d_sae":%s*20', '"d_sae": 30'),
  ['saes/bad/sae_weights.safetensors'] = torch.load_safetensors(folder .. '/jr/sae_weights.safetensors')})
local W_skip = r(D, D)
repo('mwhanna/qwen3-tiny-transcoders', {['layer_2.safetensors'] = {W_enc = W_enc:t():contiguous(), W_dec = W_dec, b_enc = b_enc,
    b_dec = b_dec, ['activation_function.threshold'] = threshold, W_skip = W_skip},
  ['layer_3.safetensors'] = {W_enc = W_enc:t():contiguous(), W_dec = W_dec, b_enc = b_enc, b_dec = b_dec, log_thresholds = threshold}})
repo('google/gemma-scope-2-tiny-pt', {['transcoder/layer_2_width_16k_l0_small_affine/params.safetensors'] = {w_enc = W_enc,
    w_dec = W_dec, b_enc = b_enc, b_dec = b_dec, threshold = threshold, affine_skip_connection = W_skip:t():contiguous()},
  ['resid_post/layer_2_width_16k_l0_small/params.safetensors'] = {w_enc = W_enc, w_dec = W_dec, b_enc = b_enc, b_dec = b_dec,
    threshold = threshold},
  ['resid_post/layer_2_width_16k_l0_small/config.json'] = json.encode{architecture = 'topk', model_name = 'gemma-v3-1b-pt'}})
-- branch v1 of the same repository: another commit, its decoder doubled
local doubled = torch.load_safetensors(folder .. '/jr/sae_weights.safetensors')
doubled.W_dec = doubled.W_dec * 2
local commit_v1 = ('cd'):rep(20)
repo('tiny/saelens', {['saes/jr/cfg.json'] = H.read(folder .. '/jr/cfg.json'), ['saes/jr/sae_weights.safetensors'] = doubled},
  'v1', commit_v1)
repo('google/gemma-scope-2b-pt-res', {['layer_3/width_tiny/average_l0_5/params.npz'] =
  {W_enc = W_enc, W_dec = W_dec, b_enc = b_enc, b_dec = b_dec, threshold = threshold}})
repo('fnlp/Llama3_1-8B-Base-LXR-8x', {['L2R/hyperparams.json'] = json.encode{d_model = D, d_sae = F, jump_relu_threshold = 0.1,
    dataset_average_activation_norm = {['in'] = 2.0}, hook_point_in = 'blocks.2.hook_resid_post'},
  ['L2R/checkpoints/final.safetensors'] = {['encoder.weight'] = W_enc:t():contiguous(), ['encoder.bias'] = b_enc,
    ['decoder.weight'] = W_dec:t():contiguous(), ['decoder.bias'] = b_dec}})
repo('EleutherAI/sae-tiny', {['layers.1/cfg.json'] = json.encode{d_in = D, num_latents = F, k = 3, activation = 'topk'},
  ['layers.1/sae.safetensors'] = {['encoder.weight'] = W_enc:t():contiguous(), ['encoder.bias'] = b_enc, W_dec = W_dec, b_dec = b_dec},
  ['layers.0.mlp/cfg.json'] = json.encode{d_in = D, num_latents = F, k = 3, transcode = true, skip_connection = true},
  ['layers.0.mlp/sae.safetensors'] = {['encoder.weight'] = W_enc:t():contiguous(), ['encoder.bias'] = b_enc, W_dec = W_dec,
    b_dec = b_dec, W_skip = r(D, D)},
  -- 'encoder.weight' of 16 latents where cfg.json says 20
  ['layers.2/cfg.json'] = json.encode{d_in = D, num_latents = F, k = 3},
  ['layers.2/sae.safetensors'] = {['encoder.weight'] = r(16, D), ['encoder.bias'] = b_enc, W_dec = W_dec, b_dec = b_dec}})

local registry = H.tmpfile([[
tiny-saelens:
  conversion_func: null
  model: tiny
  repo_id: tiny/saelens
  saes:
  - id: jumprelu
    path: saes/jr
  - id: wrong-shapes
    path: saes/bad
  - id: absent
    path: saes/absent
gemma-scope-tiny-res:
  conversion_func: gemma_2
  model: gemma-2-2b
  repo_id: google/gemma-scope-2b-pt-res
  saes:
  - id: layer_3/width_tiny/average_l0_5
    path: layer_3/width_tiny/average_l0_5
gemma-scope-tiny-att:
  conversion_func: gemma_2
  model: gemma-2-2b
  repo_id: google/gemma-scope-2b-pt-att
  saes:
  - {id: layer_3/width_tiny/average_l0_5, path: layer_3/width_tiny/average_l0_5}
llama-scope-tiny:
  conversion_func: llama_scope
  model: meta-llama/Llama-3.1-8B
  repo_id: fnlp/Llama3_1-8B-Base-LXR-8x
  saes:
  - {id: l2r, path: L2R, norm_scaling_factor: 1.25}
  - {id: l2r-unscaled, path: L2R}
  - {id: l2r-bad-scale, path: L2R, norm_scaling_factor: -1.5}
sparsify-tiny:
  conversion_func: sparsify
  model: tiny
  repo_id: EleutherAI/sae-tiny
  saes:
  - {id: layers.1, path: layers.1}
  - {id: layers.0.mlp, path: layers.0.mlp}
  - {id: layers.2, path: layers.2}
circuit-tracer-tiny:
  conversion_func: mwhanna_transcoder
  model: qwen3-tiny
  repo_id: mwhanna/qwen3-tiny-transcoders
  saes:
  - {id: layer_2, path: layer_2.safetensors}
  - {id: layer_3, path: layer_3.safetensors}
gemma-scope-2-tiny:
  conversion_func: gemma_3
  model: google/gemma-3-1b-pt
  repo_id: google/gemma-scope-2-tiny-pt
  saes:
  - {id: tc-affine, path: transcoder/layer_2_width_16k_l0_small_affine}
  - {id: res, path: resid_post/layer_2_width_16k_l0_small}
  - {id: attn, path: attn_out/layer_2_width_16k_l0_small}
  - {id: clt, path: clt/width_262k_l0_medium/layer_2}
made-up-format:
  conversion_func: temporal
  model: tiny
  repo_id: tiny/saelens
  saes:
  - {id: x, path: saes/jr}
not-cached:
  model: tiny
  repo_id: tiny/not-cached
  saes:
  - {id: x, path: x}
]])
local opts = {registry = registry, cache_dir = cache, local_files_only = true}
local x = torch.randn(6, D)
local function jump(pre, th) return pre:relu() * pre:gt(th):float() end

test("SAELens's format: the folder s:save wrote gives sae.load's features and reconstruction", function()
  local s = sae.from_pretrained('tiny-saelens', 'jumprelu', opts)
  local want = sae.load(folder .. '/jr')
  H.identical(s:encode(x), want:encode(x), 'features')
  H.identical((s(x)), (want(x)), 'reconstruction')
  eq(s.cfg.point, 'blocks.1.resid_post', 'point')
  eq(s.hf_source.commit, commit, 'commit')
  eq(s.hf_source.format, 'sae_lens', 'format')
  local v1 = sae.from_pretrained('tiny-saelens', 'jumprelu', H.merged(opts, {revision = 'v1'}))
  eq(v1.hf_source.commit, commit_v1, "revision 'v1': its commit")
  H.identical(v1.W_dec, want.W_dec * 2, "revision 'v1': its weights")
end)

test('Gemma Scope params.npz: a JumpReLU that does not subtract b_dec from its input', function()
  local s = sae.from_pretrained('gemma-scope-tiny-res', 'layer_3/width_tiny/average_l0_5', opts)
  local f = jump(x:matmul(W_enc) + b_enc, threshold)
  close(s:encode(x), f, 1e-6, 'features')
  close((s(x)), f:matmul(W_dec) + b_dec, 1e-6, 'reconstruction')
  eq(s.cfg.point, 'blocks.3.hook_resid_post', 'point (TransformerLens name, as SAELens writes it)')
end)

test("Llama Scope: one threshold, jump_relu_threshold x sqrt(D) / the average norm; the registry's scale folded in", function()
  local s = sae.from_pretrained('llama-scope-tiny', 'l2r', opts)
  local th, scale = 0.1 * math.sqrt(D) / 2.0, 1.25
  local f = jump(x:matmul(W_enc * scale) + b_enc, th)
  close(s:encode(x), f, 1e-6, 'features')
  close((s(x)), f:matmul(W_dec / scale) + b_dec / scale, 1e-6, 'reconstruction')
  close(s.threshold, torch.full({F}, th), 1e-7, 'threshold')
  raises_part(function() sae.from_pretrained('llama-scope-tiny', 'l2r-unscaled', opts) end, 'no norm_scaling_factor to fold in')
  raises_part(function() sae.from_pretrained('llama-scope-tiny', 'l2r-bad-scale', opts) end,
    "has a norm_scaling_factor that is not a positive number: -1.5")
  eq(s.hf_source.registry, registry, 'the registry it came from')
end)

test("sparsify: the k largest of ReLU((x - b_dec) W + b); a transcoder with a skip reads x as it is and adds x W_skipᵀ", function()
  local s = sae.from_pretrained('sparsify-tiny', 'layers.1', opts)
  local pre = ((x - b_dec):matmul(W_enc) + b_enc):relu()
  local v, i = pre:topk(3, -1)
  local f = torch.zeros(6, F):scatter(-1, i, v)
  close(s:encode(x), f, 1e-6, 'features')
  close((s(x)), f:matmul(W_dec) + b_dec, 1e-6, 'reconstruction')
  eq(s.cfg.point, 'blocks.1.hook_resid_post', 'point')
  local tc = sae.from_pretrained('sparsify-tiny', 'layers.0.mlp', opts)
  pre = (x:matmul(W_enc) + b_enc):relu()
  v, i = pre:topk(3, -1)
  f = torch.zeros(6, F):scatter(-1, i, v)
  close((tc(x)), f:matmul(W_dec) + b_dec + x:matmul(tc.W_skip:t()), 1e-6, 'transcoder with skip')
  eq(tc.cfg.transcoder, true, 'a transcoder')
  eq(tc.cfg.point, 'blocks.0.mlp.hook_out', "its point: the MLP's output")
end)

test("circuit-tracer's per-layer file (mwhanna's releases): W_enc stored (F, D), a JumpReLU with its threshold, x W_skipᵀ added", function()
  local tc = sae.from_pretrained('circuit-tracer-tiny', 'layer_2', opts)
  local f = jump(x:matmul(W_enc) + b_enc, threshold)
  close(tc:encode(x), f, 1e-6, 'features')
  close((tc(x)), f:matmul(W_dec) + b_dec + x:matmul(W_skip:t()), 1e-6, 'reconstruction with the skip')
  eq(tc.cfg.point, 'blocks.2.mlp.hook_out', "its point: the MLP's output")
  raises_part(function() sae.from_pretrained('circuit-tracer-tiny', 'layer_3', opts) end,
    'holds log_thresholds, which a per-layer transcoder has not')
end)

test('Gemma Scope 2: an affine transcoder (affine_skip_connection stored (D, D_out)); its refusals', function()
  local tc = sae.from_pretrained('gemma-scope-2-tiny', 'tc-affine', opts)
  local f = jump(x:matmul(W_enc) + b_enc, threshold)
  close((tc(x)), f:matmul(W_dec) + b_dec + x:matmul(W_skip:t()), 1e-6, 'reconstruction with the skip')
  eq(tc.cfg.hook_name_out, 'blocks.2.hook_mlp_out', 'what it writes')
  raises_part(function() sae.from_pretrained('gemma-scope-2-tiny', 'res', opts) end, "architecture 'topk', where Gemma Scope 2's is jump_relu")
  raises_part(function() sae.from_pretrained('gemma-scope-2-tiny', 'attn', opts) end, "reads the attention's z")
  raises_part(function() sae.from_pretrained('gemma-scope-2-tiny', 'clt', opts) end, "is a cross-layer transcoder's layer")
  -- on a Gemma the MLP's output passes through post_feedforward_layernorm before hook_mlp_out: no one module to replace
  local gemma = models.from_config({model_type = 'gemma2', vocab_size = 32, hidden_size = D, intermediate_size = 16,
    num_hidden_layers = 3, num_attention_heads = 2, num_key_value_heads = 1, head_dim = 4, query_pre_attn_scalar = 4,
    sliding_window = 4, max_position_embeddings = 32})
  raises_part(function() sae.attach(gemma, tc) end,
    "writes blocks.2.hook_mlp_out ('blocks.3.post_feedforward_layernorm' here), which is not the output of 'blocks.3.mlp'")
end)

test('a transcoder goes on the MLP: its output replaced by the reconstruction from its input', function()
  torch.manual_seed(3)
  local model = models.gpt{vocab = 11, dim = D, heads = 2, layers = 2, seq = 8, ffn = 16}
  model:eval()
  local tc = sae.from_pretrained('sparsify-tiny', 'layers.0.mlp', opts)
  local ids = torch.randint(1, 12, {1, 5})
  local seen
  local h0 = probe.replace(model, 'blocks.1.mlp', function(t, _, input) seen = tc(input); return t end)
  model(ids)
  h0:remove()
  local got
  local h = sae.attach(model, tc)
  local h2 = probe.replace(model, 'blocks.1.mlp', function(t) got = t; return t end)
  model(ids)
  h2:remove(); h:remove()
  close(got, seen, 1e-6, "the MLP's output is the transcoder's reconstruction")
  tc.cfg.hook_name_out = 'blocks.0.hook_resid_post'  -- as if it had been trained to write elsewhere
  raises_part(function() sae.attach(model, tc) end, "which is not the output of 'blocks.1.mlp'")
end)

test("a transcoder with an affine skip saved by s:save is SAELens's skip_transcoder, and reads back with its skip", function()
  local tc = sae.new{d_in = D, d_sae = F, kind = 'jumprelu', transcoder = true, skip = true, apply_b_dec_to_input = false,
    point = 'blocks.1.mlp', hook_name_out = 'blocks.0.hook_mlp_out'}
  torch.no_grad(function() tc.W_skip:copy_(r(D, D)); tc.b_dec:copy_(r(D)); tc.threshold:copy_(torch.rand(F) * 0.1) end)
  local dir = H.tmpdir() .. '/tc'
  tc:save(dir)
  local cfg = json.decode(H.read(dir .. '/cfg.json'))
  eq(cfg.architecture, 'jumprelu_skip_transcoder', 'architecture')
  local back = sae.load(dir)
  H.identical(back.W_skip, tc.W_skip, 'W_skip')
  H.identical((back(x)), (tc(x)), 'reconstruction, skip included')
  local topk = sae.new{d_in = D, d_sae = F, kind = 'topk', k = 3, transcoder = true, skip = true}
  raises_part(function() topk:save(H.tmpdir() .. '/t') end, 'SAELens has no TopK transcoder with an affine skip')
end)

test('an unknown release or id is an error naming the closest', function()
  raises_part(function() sae.from_pretrained('sparsify-tiyn', 'layers.1', opts) end, "did you mean 'sparsify-tiny'?")
  raises_part(function() sae.from_pretrained('sparsify-tiny', 'layers.7', opts) end, "has no SAE id 'layers.7'; did you mean 'layers.1'?")
  raises_part(function() sae.from_pretrained('nothing-like-it-at-all', 'x', opts) end, 'is in neither the registry')
end)

test('a registry entry of a format anatomy does not read', function()
  raises_part(function() sae.from_pretrained('made-up-format', 'x', opts) end,
    "is in the format 'temporal', which anatomy does not read (it reads sae_lens, gemma_2")
  raises_part(function() sae.from_pretrained('gemma-scope-tiny-att', 'layer_3/width_tiny/average_l0_5', opts) end,
    "per-head z (attn.hook_z, heads flattened): not read here")
end)

test('a file missing in the repository; offline without the cache', function()
  raises_part(function() sae.from_pretrained('tiny-saelens', 'absent', opts) end,
    "'tiny/saelens' at revision 'main' has no file saes/absent/sae_weights.safetensors in the cache")
  raises_part(function() sae.from_pretrained('not-cached', 'x', opts) end, "revision 'main' of 'tiny/not-cached' is not in the cache")
end)

test('shapes that disagree with the config', function()
  raises_part(function() sae.from_pretrained('tiny-saelens', 'wrong-shapes', opts) end, 'W_enc has shape 8x20, cfg.json (d_in 8, d_sae 30) says 8x30')
  raises_part(function() sae.from_pretrained('sparsify-tiny', 'layers.2', opts) end, 'W_enc has shape 8x16, its sparsify config (d_in 8, d_sae 20) says 8x20')
end)

test('the registry and the options are checked', function()
  raises_part(function() sae.from_pretrained('x', 'y', {registry = '/nonexistent/registry.yaml'}) end,
    "registry '/nonexistent/registry.yaml' does not exist")
  raises_part(function() sae.from_pretrained('x', 'y', {registry = H.tmpfile('a: {model: m}\n')}) end, "release 'a' has no repo_id")
  raises_part(function() sae.from_pretrained('x', 'y', {regsitry = registry}) end, "did you mean 'registry'")
  raises_part(function() sae.from_pretrained('tiny-saelens', 'jumprelu', {registry = registry, dtype = 'float8'}) end,
    "dtype must be 'float32', 'bfloat16' or 'float16'")
  raises_part(function() sae.from_pretrained(nil, 'x') end, 'release must be a string')
  local s = sae.from_pretrained('tiny-saelens', 'jumprelu', {registry = registry, cache_dir = cache, local_files_only = true,
    dtype = 'bfloat16'})
  eq(s.W_enc.dtype, 'bfloat16', 'dtype')
end)

test("anatomy's own entries: EleutherAI's sparsify release, its ids by layer", function()
  raises_part(function() sae.from_pretrained('sae-llama-3-8b-32x', 'layers.32', opts) end, "has no SAE id 'layers.32'; did you mean 'layers.")
  raises_part(function() sae.from_pretrained('sae-llama-3-8b-32x', 'layers.31', opts) end,
    "revision 'main' of 'EleutherAI/sae-llama-3-8b-32x' is not in the cache")
  -- no registry anywhere: the error says where it looked and lists the few
  -- releases anatomy knows (it printed '(1 releases)')
  local exe = require('anatomy.torch.native').data.realpath('/proc/self/exe')
  local p = io.popen(("env -u VIRTUAL_ENV -u CONDA_PREFIX -u ANATOMY_SAE_REGISTRY HOME=/nonexistent '%s' -e "
    .. "\"print(select(2, pcall(sae.from_pretrained, 'gemma-scope-2b-pt-res', 'x')))\" 2>&1"):format(exe))
  local out = p:read('*a')
  p:close()
  if not out:find('no sae-lens registry was found', 1, true) then H.skip('a sae-lens registry is installed system-wide') end
  assert(out:find("; the releases known: sae-llama-3-8b-32x", 1, true), out)
end)

test("SAELens 6.54's own pretrained_saes.yaml (build/venv-sae's, where installed) reads: every release checked, names resolved", function()
  local root = (arg[0]:match('^(.*)/tests/lua/') or '.') .. '/build/venv-sae/lib'
  local path
  for _, name in ipairs(fs.is_dir(root) and fs.list(root) or {}) do
    local p = ('%s/%s/site-packages/sae_lens/pretrained_saes.yaml'):format(root, name)
    if fs.exists(p) then path = p end
  end
  if not path then H.skip('no build/venv-sae with sae-lens') end
  local all = require('anatomy.features.releases').read(path, 'test')
  local n, formats = 0, {}
  for _, e in pairs(all) do n = n + 1; formats[e.conversion_func or 'sae_lens'] = true end
  eq(n > 100 and formats.gemma_2 and formats.llama_scope and formats.sae_lens, true, ('%d releases, with gemma_2, llama_scope and SAELens folders'):format(n))
  raises_part(function() sae.from_pretrained('gemma-scope-2b-pt-res-canonicl', 'layer_0/width_16k/canonical', {registry = path}) end,
    "did you mean 'gemma-scope-2b-pt-res-canonical'?")
  raises_part(function() sae.from_pretrained('gemma-scope-2b-pt-res-canonical', 'layer_0/width_16k/canonicl', {registry = path}) end,
    "did you mean 'layer_0/width_16k/canonical'?")
  raises_part(function() sae.from_pretrained('qwen-scope-3-1.7b-base-w32k-l50', 'layer0', {registry = path}) end,
    "format 'qwen_scope', which anatomy does not read: its weights are Python pickles (.pt)")
end)

H.done()
