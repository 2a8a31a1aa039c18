-- A small harness for Lua tests run by `anatomy`: test(name, fn), checks that
-- raise on failure (numeric ones print the largest difference), and a closing
-- "N passed, N failed" line with a matching exit code.
local H = {passed = 0, failed = 0, skipped = 0}

-- each result line leaves at once, so that a test that kills the process
-- (a crash in native code) is the one after the last line in ctest's log
io.stdout:setvbuf('line')

-- a temporary file holding content; returns its path
function H.tmpfile(content)
  local path = os.tmpname()
  local f = assert(io.open(path, 'wb'))
  f:write(content)
  f:close()
  return path
end

-- a new empty folder; returns its path
function H.tmpdir()
  local path = os.tmpname()
  os.remove(path)
  os.execute("mkdir -p '" .. path .. "'")
  return path
end

-- the bytes of a file
function H.read(path)
  local f = assert(io.open(path, 'rb'))
  local s = f:read('*a')
  f:close()
  return s
end

-- GPT-2's tensors as GPT2LMHeadModel saves them (Conv1D weights [in, out]),
-- names prefixed with `prefix` ('transformer.' or ''), seeded: a checkpoint
-- for models.from_pretrained. s: {C = width, L = layers, V = vocab, P = positions}.
function H.gpt2_tensors(prefix, s)
  torch.manual_seed(0)
  local C, L, V, P = s.C, s.L, s.V, s.P
  local t = {[prefix .. 'wte.weight'] = torch.randn(V, C), [prefix .. 'wpe.weight'] = torch.randn(P, C),
    [prefix .. 'ln_f.weight'] = torch.randn(C), [prefix .. 'ln_f.bias'] = torch.randn(C)}
  for i = 0, L - 1 do
    local b = prefix .. 'h.' .. i .. '.'
    for _, n in ipairs{'ln_1', 'ln_2'} do t[b .. n .. '.weight'] = torch.randn(C); t[b .. n .. '.bias'] = torch.randn(C) end
    t[b .. 'attn.c_attn.weight'] = torch.randn(C, 3 * C); t[b .. 'attn.c_attn.bias'] = torch.randn(3 * C)
    t[b .. 'attn.c_proj.weight'] = torch.randn(C, C); t[b .. 'attn.c_proj.bias'] = torch.randn(C)
    t[b .. 'mlp.c_fc.weight'] = torch.randn(C, 4 * C); t[b .. 'mlp.c_fc.bias'] = torch.randn(4 * C)
    t[b .. 'mlp.c_proj.weight'] = torch.randn(4 * C, C); t[b .. 'mlp.c_proj.bias'] = torch.randn(C)
  end
  return t
end

-- Inside a test: stop it and count it as skipped, saying why (what the machine lacks).
function H.skip(reason) error({skip = reason}, 0) end

function H.test(name, fn)
  local ok, err = xpcall(fn, function(e) return type(e) == 'table' and e.skip and e or debug.traceback(e) end)
  if not ok and type(err) == 'table' and err.skip then
    H.skipped = H.skipped + 1
    print('skip  ' .. name .. ' (' .. err.skip .. ')')
  elseif ok then
    H.passed = H.passed + 1
    print('ok    ' .. name)
  else
    H.failed = H.failed + 1
    print('FAIL  ' .. name .. '\n' .. tostring(err))
  end
end

local function show(v)
  if type(v) == 'table' then
    local parts = {}
    for i, x in ipairs(v) do parts[i] = show(x) end
    return '{' .. table.concat(parts, ', ') .. '}'
  end
  return tostring(v)
end

-- equal values (tables compared element by element, recursively)
function H.eq(got, want, what)
  local function same(a, b)
    if type(a) ~= 'table' or type(b) ~= 'table' then return a == b end
    if #a ~= #b then return false end
    for i = 1, #a do if not same(a[i], b[i]) then return false end end
    return true
  end
  if not same(got, want) then
    error(('%s: expected %s, got %s'):format(what or 'value', show(want), show(got)), 2)
  end
end

-- tensors (or nested tables, or a number for a 0-dim tensor) equal in shape and within tol elementwise
function H.close(got, want, tol, what)
  tol = tol or 1e-6
  local g = torch.is_tensor(got) and got:double() or torch.tensor(got, {dtype = 'float64'})
  local w = torch.is_tensor(want) and want:double() or torch.tensor(want, {dtype = 'float64'})
  if table.concat(g:size(), 'x') ~= table.concat(w:size(), 'x') then
    error(('%s: shape %s, expected %s'):format(what or 'tensor', table.concat(g:size(), 'x'), table.concat(w:size(), 'x')), 2)
  end
  local maxdiff = g:numel() == 0 and 0 or (g - w):abs():max():item()
  if not (maxdiff <= tol) then
    error(('%s: maxdiff %.3g exceeds tolerance %.3g\ngot %s\nexpected %s'):format(what or 'tensor', maxdiff, tol, tostring(g), tostring(w)), 2)
  end
end

-- fn raises an error whose message ends with `expected` (the position prefix varies)
function H.raises(fn, expected)
  local ok, err = pcall(fn)
  if ok then error('expected an error: ' .. expected, 2) end
  err = tostring(err)
  if err:sub(-#expected) ~= expected then
    error(('wrong error\n  got:      %s\n  expected: ...%s'):format(err, expected), 2)
  end
end

-- fn raises an error whose message contains `part` (for messages that go
-- on with details a test does not pin)
function H.raises_part(fn, part)
  local ok, err = pcall(fn)
  if ok then error('expected an error: ' .. part, 2) end
  if not tostring(err):find(part, 1, true) then
    error(('wrong error\n  got:      %s\n  expected: ...%s...'):format(tostring(err), part), 2)
  end
end

-- A tiny language model of Hugging Face's 'gpt2' or 'llama' family (3
-- layers, width 16, 4 heads (a Llama's over 2 key/value heads), 24 tokens),
-- built after torch.manual_seed(seed) and every parameter moved by
-- N(0, 0.2^2) (norms' weights away from 1, biases from 0), in eval mode:
-- the model the attribution-graph tests share.
function H.tiny_lm(kind, seed)
  local pretrained = require('anatomy.models.pretrained')
  local F = require(pretrained.families[kind])
  local c = kind == 'gpt2' and {model_type = 'gpt2', vocab_size = 24, n_positions = 16, n_embd = 16, n_layer = 3, n_head = 4}
    or {model_type = 'llama', vocab_size = 24, hidden_size = 16, intermediate_size = 32, num_hidden_layers = 3,
      num_attention_heads = 4, num_key_value_heads = 2, max_position_embeddings = 16}
  torch.manual_seed(seed)
  local m = F.build(F.check(c, 'test'))
  torch.no_grad(function()
    for _, p in ipairs(m:parameters()) do p:add_(torch.randn(p:size()) * 0.2) end
  end)
  m:eval()
  return m
end

-- A transcoder's (sae.clt) weights drawn from `seed`: every parameter
-- N(0, 0.3^2), thresholds uniform in [0, 0.2), around the pre-activations'
-- scale; returns it.
function H.randomize_transcoders(c, seed)
  torch.manual_seed(seed)
  torch.no_grad(function()
    for _, p in ipairs(c:parameters()) do p:copy_(torch.randn(p:size()) * 0.3) end
    if c.threshold then c.threshold:copy_(torch.rand(c.threshold:size()) * 0.2) end
  end)
  return c
end

-- bit-identical tensors: the largest difference is printed when it is not 0
function H.identical(got, want, what)
  local d = (got - want):abs():max():item()
  if d ~= 0 then error(('%s: the output differs from the clean one by up to %.6g'):format(what, d), 2) end
end

-- A GPT-2 checkpoint folder written here: config.json and safetensors in
-- GPT2LMHeadModel's names (extra: more config.json keys); returns its path.
function H.gpt2_folder(extra)
  local json, fs = require 'anatomy.io.json', require 'anatomy.io.fs'
  local C, L, V, P = 8, 2, 11, 16
  local t = H.gpt2_tensors('transformer.', {C = C, L = L, V = V, P = P})
  local dir = H.tmpdir()
  local cfg = {model_type = 'gpt2', vocab_size = V, n_positions = P, n_embd = C,
    n_layer = L, n_head = 2, activation_function = 'gelu_new', layer_norm_epsilon = 1e-5}
  for k, v in pairs(extra or {}) do cfg[k] = v end
  fs.write_atomic(dir .. '/config.json', json.encode(cfg))
  torch.save_safetensors(dir .. '/model.safetensors', t)
  return dir
end

function H.done()
  print(('%d passed, %d failed'):format(H.passed, H.failed) .. (H.skipped > 0 and (', %d skipped'):format(H.skipped) or ''))
  os.exit(H.failed == 0 and 0 or 1, true)  -- true: close the state, freeing every tensor
end

-- H.merged(base, extra) -> a new table: base's keys, then extra's over them
function H.merged(base, extra)
  local c = {}
  for k, v in pairs(base) do c[k] = v end
  for k, v in pairs(extra) do c[k] = v end
  return c
end

-- H.fit_f32_bf16(make, corpus, steps, seed) -> the train.fit results of a
-- model make() builds, trained in float32 and in bf16 from the same seed
-- (batch 8, seq 32, lr 3e-3): what the bf16 tests compare
function H.fit_f32_bf16(make, corpus, steps, seed)
  local function run(dtype)
    torch.manual_seed(seed)
    return train.fit(make(), corpus, {steps = steps, batch = 8, seq = 32, lr = 3e-3, seed = seed, quiet = true, dtype = dtype,
      eval_every = 1000})
  end
  return run('float32'), run('bf16')
end

-- The pretrained families (random weights, built from their config.json
-- settings; Mistral's sliding window `window`) and the built-in GPT, vocab V.
function H.family_models(V, window)
  local pretrained = require('anatomy.models.pretrained')
  local base = {vocab_size = V, hidden_size = 32, intermediate_size = 64, num_hidden_layers = 2, num_attention_heads = 4,
    max_position_embeddings = 48}
  local function with(extra) return H.merged(base, extra) end
  local configs = {
    {'gpt2', {model_type = 'gpt2', vocab_size = V, n_positions = 48, n_embd = 32, n_layer = 2, n_head = 4}},
    {'llama (grouped-query)', with{model_type = 'llama', num_key_value_heads = 2}},
    {'mistral (sliding window ' .. window .. ')', with{model_type = 'mistral', num_key_value_heads = 2, sliding_window = window}},
    {'qwen2 (q, k, v biases)', with{model_type = 'qwen2'}},
    {'gpt_neox (partial rotary, parallel)', with{model_type = 'gpt_neox', rotary_pct = 0.5, use_parallel_residual = true}},
    {'mixtral (4 experts, top-2, sliding window ' .. window .. ')', with{model_type = 'mixtral', num_key_value_heads = 2,
      num_local_experts = 4, num_experts_per_tok = 2, sliding_window = window}},
    {'phi (one norm, parallel, head bias)', with{model_type = 'phi', partial_rotary_factor = 0.5}},
    {'gptj (one norm, parallel, interleaved partial rotary, head bias)', {model_type = 'gptj', vocab_size = V, n_positions = 48,
      n_embd = 32, n_layer = 2, n_head = 4, rotary_dim = 4}},
    {'gemma2 (sliding window ' .. window .. ', four norms, both soft-cappings)', with{model_type = 'gemma2', head_dim = 8,
      sliding_window = window, attn_logit_softcapping = 0.5, final_logit_softcapping = 2}},
    {'gemma3_text (QK-norm, local RoPE base, sliding window ' .. window .. ')', with{model_type = 'gemma3_text', head_dim = 8,
      sliding_window = window, layer_types = {'sliding_attention', 'full_attention'}}},
  }
  local out = {}
  for i, c in ipairs(configs) do
    local F = require(pretrained.families[c[2].model_type])
    out[i] = {c[1], F.build(F.check(c[2], 'test'))}
  end
  out[#out + 1] = {'models.gpt (learned positions)', models.gpt{vocab = V, dim = 32, heads = 4, layers = 2, seq = 48, ffn = 64, norm = 'pre'}}
  return out
end

return H
