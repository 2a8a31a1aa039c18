-- Seed corpora for the libFuzzer targets, from valid files made the way the
-- tests make them:  anatomy tests/fuzz/make_seeds.lua OUT_DIR
-- OUT_DIR/<target>/ gets a few inputs each target must load.
local out = assert(arg[1], 'usage: make_seeds.lua OUT_DIR')
package.path = (arg[0]:match('^(.*)/') or '.') .. '/../lua/?.lua;' .. package.path  -- tests/lua/spm_model.lua
local json = require('anatomy.io.json')
local function dir(name) os.execute("mkdir -p '" .. out .. '/' .. name .. "'"); return out .. '/' .. name .. '/' end
local function put(path, bytes) local f = assert(io.open(path, 'wb')); f:write(bytes); f:close() end
local function slurp(path) local f = assert(io.open(path, 'rb')); local s = f:read('*a'); f:close(); return s end

-- safetensors: several dtypes, an empty tensor, metadata
local st = dir('safetensors')
torch.manual_seed(0)
local tmp = os.tmpname()
torch.save_safetensors(tmp, {a = torch.randn(2, 3), b = torch.arange(5):long(), c = torch.zeros(0, 4)}, {note = 'seed'})
put(st .. 'mixed', slurp(tmp))
torch.save_safetensors(tmp, {w = torch.randn(4, 4):to('float16'), flag = torch.ones(3):bool()})
put(st .. 'half_bool', slurp(tmp))
torch.save_safetensors(tmp, {x = torch.tensor(3.5)})
put(st .. 'scalar', slurp(tmp))
os.remove(tmp)

-- tokenizer.json: byte-level (GPT-2's layout) and SentencePiece-style
local tj = dir('tokenizer_json')
local vocab, n = {}, 0
for _, t in ipairs{'a', 'b', 'c', 'h', 'e', 'l', 'o', '!', 'Ġ', 'Ċ', '1', '2', '3'} do vocab[t] = n; n = n + 1 end
for _, t in ipairs{'he', 'll', 'hell', 'hello', 'Ġhello'} do vocab[t] = n; n = n + 1 end
put(tj .. 'byte_level.json', json.encode{version = '1.0',
  added_tokens = {{id = n, content = '<|endoftext|>', special = true, lstrip = false, rstrip = false, single_word = false, normalized = false}},
  normalizer = json.null, pre_tokenizer = {type = 'ByteLevel', add_prefix_space = false, use_regex = true},
  post_processor = json.null, decoder = {type = 'ByteLevel'},
  model = {type = 'BPE', dropout = json.null, unk_token = json.null, fuse_unk = false, byte_fallback = false,
    vocab = vocab, merges = {'h e', 'l l', 'he ll', 'hell o', 'Ġ hello'}}})
local sp, m = {['<unk>'] = 0, ['<s>'] = 1, ['</s>'] = 2}, 3
for b = 0, 255 do sp[('<0x%02X>'):format(b)] = m; m = m + 1 end
for _, t in ipairs{'▁', 'h', 'e', 'l', 'o', '▁h', 'll', '▁he', 'llo', '▁hello'} do sp[t] = m; m = m + 1 end
put(tj .. 'sentencepiece_style.json', json.encode{version = '1.0',
  added_tokens = {{id = 1, content = '<s>', special = true, lstrip = false, rstrip = false, single_word = false, normalized = false}},
  normalizer = json.null, pre_tokenizer = {type = 'Metaspace', replacement = '▁', prepend_scheme = 'first', split = false},
  post_processor = {type = 'TemplateProcessing', single = {{SpecialToken = {id = '<s>', type_id = 0}}, {Sequence = {id = 'A', type_id = 0}}},
    pair = {}, special_tokens = {['<s>'] = {id = '<s>', ids = {1}, tokens = {'<s>'}}}},
  decoder = {type = 'Sequence', decoders = {{type = 'Replace', pattern = {String = '▁'}, content = ' '}, {type = 'ByteFallback'},
    {type = 'Fuse'}, {type = 'Strip', content = ' ', start = 1, stop = 0}}},
  model = {type = 'BPE', dropout = json.null, unk_token = '<unk>', fuse_unk = true, byte_fallback = true,
    vocab = sp, merges = {'▁ h', 'l l', '▁h e', 'll o', '▁he llo'}}})

-- tokenizer.model: the SentencePiece BPE model the tests write (tests/lua/spm_model.lua)
local tm = dir('tokenizer_model')
put(tm .. 'bpe.model', require('spm_model').bytes())

-- rationals
local ra = dir('rational')
for i, s in ipairs{'3/2', '-7', ' 1/10 ', '0', '123456789012345678901234567890/7', '-0/5'} do put(ra .. i, s) end

-- the Lua readers: a GPT-2 config.json, metrics lines, script arguments
local lr = dir('lua_readers')
put(lr .. 'gpt2_config.json', json.encode{model_type = 'gpt2', vocab_size = 20, n_positions = 8, n_embd = 8, n_layer = 1, n_head = 2})
put(lr .. 'llama_config.json', json.encode{model_type = 'llama', vocab_size = 20, hidden_size = 8, intermediate_size = 12,
  num_hidden_layers = 1, num_attention_heads = 2, num_key_value_heads = 1, rope_theta = 10000,
  rope_scaling = {rope_type = 'llama3', factor = 8, low_freq_factor = 1, high_freq_factor = 4, original_max_position_embeddings = 64}})
put(lr .. 'metrics.jsonl', '{"step": 1, "loss": 2.5, "lr": 0.001}\n{"step": 2, "loss": 2.4, "lr": 0.001}\n')
put(lr .. 'args', '--steps=5\n--lr=0.01\n--name=abc\n--flag=true\n')

-- a checkpoint of the small GPT tests/fuzz/checkpoint.cpp loads, after one step (so with AdamW's state)
local ck = dir('checkpoint')
torch.manual_seed(0)
local gpt = models.gpt{vocab = 8, dim = 8, heads = 2, layers = 1, seq = 4, ffn = 8}
local adam = optim.AdamW(gpt:parameters(), {lr = 1e-3})
gpt(torch.tensor({{1, 2, 3, 4}}, {dtype = 'int64'})):sum():backward()
adam:step()
train.save_checkpoint(tmp, gpt, adam, 1, {note = 'seed'})
put(ck .. 'gpt_adamw', slurp(tmp))
os.remove(tmp)

-- texts for the corpus loaders: ASCII, UTF-8 of 2, 3 and 4 bytes, a byte that is no UTF-8, empty
local co = dir('corpus')
put(co .. 'ascii', 'to be or not to be, that is the question\n')
put(co .. 'utf8', 'caf\195\169 \230\151\165\230\156\172 \240\159\145\139 na\195\175ve\n')
put(co .. 'latin1', 'caf\233\n')
put(co .. 'empty', '')
-- .npz: stored and deflated, several dtypes, a scalar and an empty array
local nz = dir('npz')
tmp = os.tmpname() .. '.npz'
torch.save_npz(tmp, {W_enc = torch.randn(4, 3), b_enc = torch.zeros(3), threshold = torch.rand(3):double()})
put(nz .. 'gemma_scope_like.npz', slurp(tmp))
torch.save_npz(tmp, {ids = torch.arange(6):long():view(2, 3), mask = torch.ones(2):bool(), x = torch.tensor(1.5)}, {compressed = true})
put(nz .. 'compressed.npz', slurp(tmp))
torch.save_npz(tmp, {h = torch.randn(2, 2):to('float16'), e = torch.zeros(0, 2), b = torch.arange(4):to('uint8')})
put(nz .. 'half_empty_byte.npz', slurp(tmp))
os.remove(tmp)

-- YAML: a registry's shape (SAELens's pretrained_saes.yaml), anchors,
-- flow collections, block scalars, the core schema's scalars and tags
local ym = dir('yaml')
put(ym .. 'registry.yaml', [[
gemma-scope-2b-pt-res:
  conversion_func: gemma_2
  model: gemma-2-2b
  repo_id: google/gemma-scope-2b-pt-res
  saes:
  - id: layer_0/width_16k/average_l0_105
    path: layer_0/width_16k/average_l0_105
    l0: 105.0
    neuronpedia: gemma-2-2b/0-gemmascope-res-16k
  - id: layer_1/width_16k/average_l0_102
    path: layer_1/width_16k/average_l0_102
    l0: 102
]])
put(ym .. 'anchors.yaml', "base: &b {lr: 1.0e-3, steps: 10, on: yes, off: ~}\nrun: *b\nlist: [1, 0x1F, 0o17, -.inf, .nan, true, null, 'quoted', \"dq\\n\"]\n")
put(ym .. 'block.yaml', "text: |\n  line one\n  line two\nfolded: >\n  a\n  b\ntagged: !!str 12\nnum: !!float 3\n")
print(('seeds written to %s'):format(out))
