-- models.from_pretrained on Hugging Face folders written here (config.json and
-- safetensors with GPT-2's names and Conv1D layout): the weights land where
-- they belong, and every broken folder is an error naming the file and the
-- tensor, with nothing half-loaded returned. (Numbers against transformers:
-- tests/parity/test_pretrained_parity.py.)
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local native = require('anatomy.torch.native')
local test, eq, raises = H.test, H.eq, H.raises
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')

local C, L, V, P = 8, 2, 11, 16
local config = {model_type = 'gpt2', vocab_size = V, n_positions = P, n_embd = C, n_layer = L, n_head = 2,
  activation_function = 'gelu_new', layer_norm_epsilon = 1e-5}

-- GPT-2's tensors, as GPT2LMHeadModel saves them (Conv1D weights are [in, out]).
local function gpt2_tensors(prefix) return H.gpt2_tensors(prefix, {C = C, L = L, V = V, P = P}) end

local function folder(cfg, tensors)
  local dir = os.tmpname()
  os.remove(dir)
  fs.mkdir(dir)
  if cfg then fs.write_atomic(dir .. '/config.json', json.encode(cfg)) end
  if tensors then torch.save_safetensors(dir .. '/model.safetensors', tensors) end
  return dir
end
local function remove(dir) os.execute("rm -rf '" .. dir .. "'") end

-- The autopsy of a checkpoint reuses work (model:hidden_from): removing block
-- j reruns only the blocks after it from the stream block j read, the last
-- block's lens is the forward's own logits, removing k blocks together runs
-- from the first of them. Its columns must be what the direct computation
-- gives: a whole forward with the blocks skipped, the head read on each
-- block's output.
test('the autopsy of a checkpoint: removal and lens columns equal the direct computation', function()
  local cfg = {}
  for k, v in pairs(config) do cfg[k] = v end
  cfg.n_layer = 4
  local dir = folder(cfg, H.gpt2_tensors('transformer.', {C = C, L = 4, V = V, P = P}))
  local m = models.from_pretrained(dir)
  remove(dir)
  eq(type(m.hidden_from), 'function')
  torch.manual_seed(3)
  local batches = {{torch.randint(1, V + 1, {3, 12}), torch.randint(1, V + 1, {3, 12})},
                   {torch.randint(1, V + 1, {3, 12}), torch.randint(1, V + 1, {3, 12})}}
  local n = 0
  local source = {batch = function() n = n % 2 + 1; return batches[n][1], batches[n][2] end}
  local a = autopsy.run(m, source, {steps = 2, seq = 12})
  local function mean_over_batches(fn)
    local sum = 0
    for _, b in ipairs(batches) do sum = sum + fn(b[1], b[2]) end
    return sum / #batches
  end
  local largest = 0
  for j = 1, 4 do
    local row = a.rows[j + 1]
    eq(row.name, 'h.' .. j)
    local h = probe.skip(m, 'h.' .. j)
    local removal = mean_over_batches(function(x, y)
      return torch.no_grad(function() return nn.functional.cross_entropy(m(x), y):item() end)
    end)
    h:remove()
    local lens = mean_over_batches(function(x, y)
      local cap = probe.capture(m, {filter = {'h.' .. j}}, function() torch.no_grad(function() m(x) end) end)
      return torch.no_grad(function() return nn.functional.cross_entropy(m:readout(cap['h.' .. j]), y):item() end)
    end)
    largest = math.max(largest, math.abs(row.removal_loss - removal) / removal, math.abs(row.lens_loss - lens) / lens)
  end
  -- the k least influential blocks removed together: a whole forward with each skipped
  eq(a.removal.k, 2)
  local hs = {}
  for _, name in ipairs(a.removal.blocks) do hs[#hs + 1] = probe.skip(m, name) end
  local together = mean_over_batches(function(x, y)
    return torch.no_grad(function() return nn.functional.cross_entropy(m(x), y):item() end)
  end)
  for _, h in ipairs(hs) do h:remove() end
  largest = math.max(largest, math.abs(a.removal.loss - together) / together)
  print(('  largest relative difference from the direct computation: %.2e'):format(largest))
  assert(largest < 1e-5, 'autopsy columns differ from the direct computation by ' .. largest)
end)

test('GPT-2: weights placed (Conv1D transposed, layers from 1), tied head, either prefix', function()
  for _, prefix in ipairs{'transformer.', ''} do
    local t = gpt2_tensors(prefix)
    local dir = folder(config, t)
    local m, tok = models.from_pretrained(dir)
    eq(tok, nil, 'no tokenizer files: no tokenizer')
    eq(m.training, false, 'eval mode')
    local p = {}
    for name, param in m:named_parameters() do p[name] = param end
    eq((p['h.2.attn.qkv.weight'] - t[prefix .. 'h.1.attn.c_attn.weight']:t()):abs():max():item(), 0, 'h.2 is h.1, transposed')
    eq((p['h.1.mlp.proj.weight'] - t[prefix .. 'h.0.mlp.c_proj.weight']:t()):abs():max():item(), 0)
    eq((p['h.1.ln_2.bias'] - t[prefix .. 'h.0.ln_2.bias']):abs():max():item(), 0)
    local ids = torch.tensor({{1, 5, 11}}, {dtype = 'int64'})
    local logits = m(ids)
    eq(logits:size(), {1, 3, V})
    -- the tied head: logits of the last position are ln_f(h) . wte
    local h = m.wte(ids) + m.wpe.weight:narrow(1, 1, 3)
    for i = 1, L do h = m.h[i](h) end
    eq((nn.functional.linear(m.ln_f(h), m.wte.weight) - logits):abs():max():item(), 0)
    eq(models.hf_name('h.1.attn'), 'h.0.attn')
    eq(models.anatomy_name('h.0.attn'), 'h.1.attn')
    remove(dir)
  end
end)

test('broken folders: each an error naming what is wrong', function()
  local t = gpt2_tensors('')
  local cases = {}
  local function case(cfg, tensors, expected, prepare)
    cases[#cases + 1] = {cfg, tensors, expected, prepare}
  end
  local missing = gpt2_tensors(''); missing['h.1.mlp.c_fc.bias'] = nil
  case(config, missing, "has no tensor h.1.mlp.c_fc.bias (for h.2.mlp.fc.bias)")
  local wrong = gpt2_tensors(''); wrong['h.0.attn.c_attn.weight'] = torch.randn(3 * C, C)
  case(config, wrong, 'h.0.attn.c_attn.weight has shape 24x8 in the checkpoint, expected 8x24 for h.1.attn.qkv.weight (stored transposed, [in, out])')
  local extra = gpt2_tensors(''); extra['h.0.attn.rotary.inv_freq'] = torch.randn(4)
  case(config, extra, 'the checkpoint has a tensor anatomy does not place: h.0.attn.rotary.inv_freq')
  local llama = {}; for k, v in pairs(config) do llama[k] = v end; llama.model_type = 'mamba'
  case(llama, t, "model_type 'mamba' in")
  local inv = {}; for k, v in pairs(config) do inv[k] = v end; inv.scale_attn_by_inverse_layer_idx = true
  case(inv, t, 'config.json has scale_attn_by_inverse_layer_idx = true, which anatomy does not support (attention is scaled by 1/sqrt(head dim) only)')
  local act = {}; for k, v in pairs(config) do act[k] = v end; act.activation_function = 'swish'
  case(act, t, 'config.json has activation_function = "swish", which anatomy does not support (supported: gelu_new, gelu_pytorch_tanh, gelu, relu)')
  case(nil, t, "has no config.json")
  case(config, nil, "has neither model.safetensors nor model.safetensors.index.json")
  case(config, nil, "the shard 'model-00002-of-00002.safetensors' that", function(dir)
    local half = {}
    for k, v in pairs(t) do half[k] = 'model-00002-of-00002.safetensors' end
    half['wte.weight'] = 'model-00001-of-00002.safetensors'
    torch.save_safetensors(dir .. '/model-00001-of-00002.safetensors', {['wte.weight'] = t['wte.weight']})
    fs.write_atomic(dir .. '/model.safetensors.index.json', json.encode({weight_map = half}))
  end)
  for _, c in ipairs(cases) do
    local dir = folder(c[1], c[2])
    if c[4] then c[4](dir) end
    local ok, err = pcall(models.from_pretrained, dir)
    eq(ok, false, c[3])
    assert(tostring(err):find(c[3], 1, true), ('expected %q in %q'):format(c[3], tostring(err)))
    remove(dir)
  end
  raises(function() models.from_pretrained('/no/such/folder') end, "models.from_pretrained: '/no/such/folder' is not a folder (nor a Hub repository id)")
  raises(function() models.from_pretrained('/tmp', {dtype = 'int8'}) end, "models.from_pretrained: dtype must be 'float32', 'bfloat16' (or 'bf16'), 'float16' (or 'fp16') or 'auto' (the checkpoint's), got 'int8'")
  raises(function() models.from_pretrained('/tmp') end, "models.from_pretrained: '/tmp' has no config.json")
end)

test('save_pretrained writes the layout back: read again, every parameter is equal', function()
  local dir = folder(config, gpt2_tensors(''))
  local m = models.from_pretrained(dir)
  local out = dir .. '/saved'
  eq(m:save_pretrained(out), out)
  local again = models.from_pretrained(out)
  local a = {}
  for name, p in m:named_parameters() do a[name] = p end
  for name, p in again:named_parameters() do eq((p - a[name]):abs():max():item(), 0, name) end
  local saved = torch.load_safetensors(out .. '/model.safetensors')
  eq(saved['transformer.h.0.attn.c_attn.weight']:size(), {C, 3 * C}, 'Conv1D layout, [in, out]')
  raises(function() models.gpt{vocab = 5, dim = 8, heads = 2, layers = 1, seq = 4, ffn = 8}:save_pretrained(out) end,
    'save_pretrained: models.GPT did not come from models.from_pretrained (it has no Hugging Face config)')
  remove(dir)
end)

test("probes take the checkpoint's names too", function()
  local dir = folder(config, gpt2_tensors('transformer.'))
  local m = models.from_pretrained(dir)
  raises(function() probe.resolve_name(m, 'h.0.attn') end,  -- not the first layer a second time (test_hooks.lua)
    "'h.0.attn': anatomy counts layers from 1, so a layer 0 is no anatomy name: write 'h.1.attn', or the checkpoint's own name 'transformer.h.0.attn'")
  eq(probe.resolve_name(m, 'transformer.h.1.mlp'), 'h.2.mlp')
  eq(probe.resolve_name(m, 'transformer.ln_f'), 'ln_f')
  eq(probe.resolve_name(m, 'h.1'), 'h.1', "anatomy's own name wins")
  local ids = torch.tensor({{1, 2, 3}}, {dtype = 'int64'})
  local cap = probe.capture(m, {filter = {'transformer.h.0', 'transformer.h.1.attn.pattern'}}, function() return m(ids) end)
  assert(cap['h.1'] ~= nil and cap['h.2.attn.pattern'] ~= nil, 'captured under their anatomy names')
  local h = probe.skip(m, 'transformer.h.1')
  h:remove()
  -- train.fit's short dtype names here too
  eq(models.from_pretrained(dir, {dtype = 'bf16'}):parameters()[1].dtype, 'bfloat16')
  eq(models.from_pretrained(dir, {dtype = 'fp16'}):parameters()[1].dtype, 'float16')
  eq(torch.zeros(2, {dtype = 'bf16'}).dtype, 'bfloat16')
  remove(dir)
end)

test("a checkpoint's dropout, which anatomy does not apply, is stated when the model prints", function()
  local dir = H.gpt2_folder{attn_pdrop = 0.1, resid_pdrop = 0.1, embd_pdrop = 0.05, summary_first_dropout = 0}
  local m = models.from_pretrained(dir)
  local text = tostring(m)
  assert(text:find('dropout of the checkpoint not applied (attn_pdrop=0.1, embd_pdrop=0.05, resid_pdrop=0.1)', 1, true), text)
  -- and indeed not applied: train mode gives the eval-mode output
  local ids = torch.randint(1, 12, {2, 6})
  m:train()
  local a = torch.no_grad(function() return m(ids) end)
  m:eval()
  H.identical(torch.no_grad(function() return m(ids) end), a, 'train mode against eval mode')
  os.execute("rm -rf '" .. dir .. "'")
  local quiet = models.from_pretrained(H.gpt2_folder())
  assert(not tostring(quiet):find('dropout', 1, true), 'no note without dropout')
end)

test("by name from huggingface_hub's cache alone (local_files_only): the snapshot's links read, what is missing named", function()
  local fs = require('anatomy.io.fs')
  local folder = H.gpt2_folder()
  local cache = H.tmpdir()
  local repo = cache .. '/models--org--tiny-gpt2'
  local commit = ('0123456789abcdef'):rep(3):sub(1, 40)
  -- the layout huggingface_hub writes: blobs, snapshots/<commit>/<file> as relative links, refs/main
  fs.mkdir(repo .. '/blobs')
  fs.mkdir(repo .. '/snapshots/' .. commit)
  for i, f in ipairs{'config.json', 'model.safetensors'} do
    fs.write_atomic(repo .. '/blobs/etag' .. i, fs.read(folder .. '/' .. f))
    native.symlink('../../blobs/etag' .. i, repo .. '/snapshots/' .. commit .. '/' .. f)
  end
  -- (the reason reads HF_HUB_OFFLINE=1 where the environment says so, as the test suite's does)
  local where = "and revision 'main' of 'org/tiny-gpt2' is not in the cache (no " .. repo .. "/refs/main)"
  H.raises_part(function() models.from_pretrained('org/tiny-gpt2', {local_files_only = true, cache_dir = cache}) end, where)
  fs.write_atomic(repo .. '/refs/main', commit)
  local by_name = models.from_pretrained('org/tiny-gpt2', {local_files_only = true, cache_dir = cache})
  local by_folder = models.from_pretrained(folder)
  local ids = torch.tensor({{1, 2, 3, 4}}):long()
  H.identical(torch.no_grad(function() return by_name(ids) end), torch.no_grad(function() return by_folder(ids) end), 'logits')
  H.eq(by_name.hf_source.commit, commit, 'the commit is kept for provenance')
  H.eq(by_name.hf_folder, repo .. '/snapshots/' .. commit, 'the snapshot folder')
  -- a commit by its id needs no ref
  models.from_pretrained('org/tiny-gpt2', {revision = commit, local_files_only = true, cache_dir = cache})
  os.remove(repo .. '/snapshots/' .. commit .. '/model.safetensors')
  H.raises_part(function() models.from_pretrained('org/tiny-gpt2', {local_files_only = true, cache_dir = cache}) end,
    "'org/tiny-gpt2' at revision 'main' (commit 0123456789ab) has neither model.safetensors nor model.safetensors.index.json in the cache")
  H.raises_part(function() data.tokenizer('org/tiny-gpt2', {local_files_only = true, cache_dir = cache}) end,
    'data.tokenizer: ' .. "'org/tiny-gpt2' at revision 'main' (commit 0123456789ab) has no tokenizer file")
end)

test('by name: options checked before anything is fetched, local paths never sent to the Hub', function()
  local folder = H.gpt2_folder()
  H.raises(function() models.from_pretrained(folder, {revision = 'step1'}) end,
    ("models.from_pretrained: option 'revision' is for a Hub repository id, and '%s' is a local folder"):format(folder))
  H.raises(function() models.from_pretrained('org/name', {revision = 3}) end, 'models.from_pretrained: revision must be a non-empty string, got 3')
  H.raises(function() models.from_pretrained('org/name', {dtype = 'int8'}) end,
    "models.from_pretrained: dtype must be 'float32', 'bfloat16' (or 'bf16'), 'float16' (or 'fp16') or 'auto' (the checkpoint's), got 'int8'")
  H.raises(function() models.from_pretrained('org/name', {local_files_only = 'yes'}) end,
    'models.from_pretrained: local_files_only must be true or false, got yes')
  H.raises(function() models.from_pretrained('./no/such/folder') end, "models.from_pretrained: './no/such/folder' is not a folder (nor a Hub repository id)")
  H.raises(function() models.from_pretrained('/no/such') end, "models.from_pretrained: '/no/such' is not a folder (nor a Hub repository id)")
  H.raises(function() models.from_pretrained('a/b/c') end, "models.from_pretrained: 'a/b/c' is not a folder (nor a Hub repository id)")
  H.raises(function() models.from_pretrained(42) end, 'models.from_pretrained: name must be a folder or a Hub repository id, got number')
  H.raises(function() data.tokenizer(folder, {revision = 'x'}) end,
    ("data.tokenizer: option 'revision' is for a Hub repository id, and '%s' is a local path"):format(folder))
  for name, ok in pairs{['EleutherAI/pythia-70m'] = true, gpt2 = true, ['meta-llama/Llama-3.2-1B'] = true, ['a--b/c'] = false,
      ['a/../b'] = false, ['./x'] = false, ['/x/y'] = false, ['a/b/c'] = false, [''] = false, ['-a/b'] = false} do
    H.eq(hub.is_repo_id(name), ok, name)
  end
end)

test('a local folder with only pytorch_model.bin is refused: why, and how to convert', function()
  local fs = require('anatomy.io.fs')
  local dir = H.gpt2_folder()
  os.remove(dir .. '/model.safetensors')
  fs.write_atomic(dir .. '/pytorch_model.bin', 'pickle')
  H.raises_part(function() models.from_pretrained(dir) end, 'has its weights only as pytorch_model.bin, a Python pickle; anatomy loads safetensors only')
end)

test('models.from_config: fresh weights of a family, written by save_pretrained and read back the same', function()
  local cfg = {model_type = 'gpt2', vocab_size = V, n_positions = P, n_embd = 32, n_layer = 2, n_head = 2}
  local m = models.from_config(cfg, {seed = 3})
  local wte = m.wte.weight
  H.close((wte:std():item()), 0.02, 0.003, 'N(0, 0.02)')
  local params = {}
  for name, p in m:named_parameters() do params[name] = p end
  eq(params['h.1.ln_1.weight']:eq(1):all():item(), true, 'norms start at one')
  eq(params['h.1.attn.qkv.bias']:eq(0):all():item(), true, 'biases at zero')
  H.identical(models.from_config(cfg, {seed = 3}).wte.weight, wte, 'the same seed, the same weights')
  local dir = folder(nil, nil)
  m:save_pretrained(dir)
  local back = models.from_pretrained(dir)
  remove(dir)
  local x = torch.randint(1, V + 1, {2, 6})
  H.identical(back(x), m(x), 'the checkpoint reads back as it was written')
  eq(back.hf_config.n_embd, 32)
  local known = {}  -- every family registered, sorted (they grow: phi, ...)
  for k in pairs(require('anatomy.models.pretrained').families) do known[#known + 1] = k end
  table.sort(known)
  local listed = ',' .. table.concat(known, ',') .. ','
  for _, k in ipairs{'gpt2', 'gpt_neox', 'llama', 'mistral'} do assert(listed:find(',' .. k .. ',', 1, true), listed) end
  raises(function() models.from_config({model_type = 'bert'}) end,
    "models.from_config: model_type 'bert' is not supported (supported: " .. table.concat(known, ', ') .. ")")
  raises(function() models.from_config({model_type = 'gpt2', vocab_size = V, n_positions = P, n_embd = 32, n_layer = 2, n_head = 2,
    initializer_range = -1}) end, 'models.from_config: initializer_range must be a positive number, got -1')
  raises(function() models.from_config(cfg, {sed = 1}) end, "models.from_config: unknown option 'sed', did you mean 'seed'? (expected seed)")
end)

-- A config.json that says n_layer = 10^9 (or a width of 2^20) over a tiny
-- checkpoint: refused from the sizes alone, before a module is made, naming
-- the file, the keys, the count, the bytes, what the weights hold and the
-- memory left; building it first ran minutes before the allocator refused.
test('a config far larger than its weights: refused at once, naming the keys, the count and the memory', function()
  local cases = {
    {{n_layer = 1e9}, 'n_layer = 1000000000', '872,000,000,232 parameters, 3.2 TiB in float32'},
    {{n_embd = 2^20}, 'n_embd = 1048576', '26,388,336,738,304 parameters, 96.0 TiB in float32'},
    {{n_positions = 2^31, n_embd = 2^14}, 'n_positions = 2147483648', 'TiB in float32'},
  }
  for _, c in ipairs(cases) do
    local dir = H.gpt2_folder(c[1])
    local start = os.clock()
    local ok, err = pcall(models.from_pretrained, dir)
    local took = os.clock() - start
    err = tostring(err)
    print(('  %s: refused in %.4f s of CPU'):format(c[2], took))
    eq(ok, false, c[2])
    assert(took < 5, ('%s: the refusal took %.1f s of CPU (expected well under a second)'):format(c[2], took))
    for _, part in ipairs{"models.from_pretrained: '" .. dir .. "/config.json' implies ", c[3], c[2],
        "but the weights in '" .. dir .. "/model.safetensors' hold 1,976: the config does not describe these weights",
        'of memory left'} do
      assert(err:find(part, 1, true), ('expected %q in %q'):format(part, err))
    end
    remove(dir)
  end
  -- the same folder with the config its weights were saved with loads
  local dir = H.gpt2_folder()
  local m = models.from_pretrained(dir)
  eq(m.config.layers, 2)
  remove(dir)
end)

test('config dimensions: zero, negative, fractional, NaN, infinite or past 2^31 is an error naming the key and value', function()
  local base = {model_type = 'gpt2', vocab_size = V, n_positions = P, n_embd = C, n_layer = L, n_head = 2}
  local function with(k, v) return H.merged(base, {[k] = v}) end
  local tail = ', which is not a dimension (a whole number from 1 to 2^31)'
  for _, c in ipairs{{'n_layer', 0, '0'}, {'n_layer', -2, '-2'}, {'n_embd', 8.5, '8.5'}, {'vocab_size', 2^31 + 1, '2147483649'},
      {'n_inner', 0, '0'}, {'n_head', math.huge, 'inf'}} do
    raises(function() models.from_config(with(c[1], c[2])) end, ('models.from_config: config.json has %s = %s%s'):format(c[1], c[3], tail))
  end
  H.raises_part(function() models.from_config(with('n_layer', 0 / 0)) end, 'models.from_config: config.json has n_layer = ')
  H.raises_part(function() models.from_config(with('n_layer', 0 / 0)) end, 'nan' .. tail)
  -- read from the file: a huge literal is infinite, a fraction stays one
  for _, c in ipairs{{'1e999', 'inf'}, {'2.5', '2.5'}} do
    local dir = folder(nil, gpt2_tensors(''))
    fs.write_atomic(dir .. '/config.json', (json.encode(base):gsub('"n_layer":%d+', '"n_layer":' .. c[1])))
    raises(function() models.from_pretrained(dir) end, ('models.from_pretrained: config.json has n_layer = %s%s'):format(c[2], tail))
    remove(dir)
  end
  local llama = {model_type = 'llama', vocab_size = V, hidden_size = 32, intermediate_size = 64, num_hidden_layers = 2,
    num_attention_heads = 4}
  for _, k in ipairs{'num_key_value_heads', 'head_dim', 'intermediate_size', 'max_position_embeddings'} do
    local c = H.merged(llama, {[k] = -1})
    raises(function() models.from_config(c) end, ('models.from_config: config.json has %s = -1%s'):format(k, tail))
  end
  local neox = {model_type = 'gpt_neox', vocab_size = V, hidden_size = 32, intermediate_size = 64, num_hidden_layers = 1e-3,
    num_attention_heads = 4}
  raises(function() models.from_config(neox) end, 'models.from_config: config.json has num_hidden_layers = 0.001' .. tail)
end)

-- The count each family's config implies (what pretrained.check_size
-- compares) is the count of the model it builds, for every switch that adds
-- or removes parameters.
test('the parameters a config implies are those its model has, in every family', function()
  local pretrained = require('anatomy.models.pretrained')
  local base = {vocab_size = V, hidden_size = 32, intermediate_size = 48, num_hidden_layers = 2, num_attention_heads = 4}
  local function with(extra) return H.merged(base, extra) end
  local configs = {
    {model_type = 'gpt2', vocab_size = V, n_positions = P, n_embd = 32, n_layer = 3, n_head = 4},
    {model_type = 'gpt2', vocab_size = V, n_positions = P, n_embd = 32, n_layer = 1, n_head = 4, n_inner = 24, tie_word_embeddings = false},
    with{model_type = 'llama', num_key_value_heads = 2},
    with{model_type = 'llama', tie_word_embeddings = true, head_dim = 16, attention_bias = true, mlp_bias = true},
    with{model_type = 'mistral', num_key_value_heads = 1, sliding_window = 4},
    with{model_type = 'qwen2', num_key_value_heads = 2},
    with{model_type = 'gpt_neox', rotary_pct = 0.5},
    with{model_type = 'gpt_neox', attention_bias = false, tie_word_embeddings = true},
  }
  for _, c in ipairs(configs) do
    local F = require(pretrained.families[c.model_type])
    local m = models.from_config(c)
    local n = 0
    for _, p in m:named_parameters() do n = n + p:numel() end
    eq(F.parameters(m.config), n, c.model_type .. ': parameters implied and built')
  end
  -- more than memory holds: refused before anything is made, naming what is left
  if native.available_memory() == 0 then return end
  local huge = with{model_type = 'llama', hidden_size = 2^16, intermediate_size = 2^18, num_hidden_layers = 80, num_attention_heads = 64}
  H.raises_part(function() models.from_config(huge) end,
    'models.from_config: the config implies 5,497,570,131,968 parameters, 20.0 TiB in float32 (num_hidden_layers = 80, '
    .. 'hidden_size = 65536, intermediate_size = 262144, num_attention_heads = 64, vocab_size = 11), more than the ')
  H.raises_part(function() models.from_config(huge) end, 'of memory this machine has left (RAM available and free swap')
end)

-- save_pretrained copied vocab.json and merges.txt but not added_tokens.json
-- beside them (GPT-J's 143 extra tokens): the saved folder's tokenizer lost them.
test("save_pretrained keeps added_tokens.json, the added tokens beside vocab.json and merges.txt", function()
  local json = require('anatomy.io.json')
  local dir = H.gpt2_folder()
  fs.write_atomic(dir .. '/vocab.json', json.encode({['<|endoftext|>'] = 0, a = 1, b = 2, ['Ġ'] = 3, ab = 4}))
  fs.write_atomic(dir .. '/merges.txt', '#version: 0.2\na b\n')
  fs.write_atomic(dir .. '/added_tokens.json', json.encode({['<|extra_0|>'] = 5, ['<|extra_1|>'] = 6}))
  local model, tok = models.from_pretrained(dir)
  eq(tok.vocab_size, 7, 'the added tokens read from the folder')
  local out = H.tmpdir() .. '/saved'
  model:save_pretrained(out)
  local again = data.tokenizer(out)
  eq(again.vocab_size, 7, 'and from the saved folder')
  eq(torch.equal(again:encode('ab<|extra_1|>'), tok:encode('ab<|extra_1|>')), true, 'an added token encodes as before')
end)

H.done()
