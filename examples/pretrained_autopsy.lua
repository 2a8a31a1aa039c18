-- The autopsy of a published model: load a Hugging Face checkpoint (GPT-2,
-- Pythia, Llama, Mistral, Qwen2) by Hub name or folder with
-- models.from_pretrained, read a text with the model's own tokenizer, and run
-- the same autopsy as on a model trained here (logit lens, layer removal,
-- attention), with its report.
--   anatomy examples/pretrained_autopsy.lua --model=EleutherAI/pythia-70m [--revision=step1000] [--data=FILE] [--seq=128]
--   anatomy examples/pretrained_autopsy.lua --model=FOLDER [--data=FILE]
--   anatomy examples/pretrained_autopsy.lua --smoke=true   (a tiny random GPT-2 made here)
-- Every key below can be overridden with --key=value; --help lists them.
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')
local cfg = torch.config.parse({
  model = '',              -- a Hub repository id, or a Hugging Face model folder (config.json, safetensors, tokenizer)
  revision = '',           -- with a Hub name: a branch, tag or commit (empty: main)
  data = '',               -- a text file; empty: the King James Bible (Debian's bible-kjv)
  seq = 128, batch = 8,    -- the windows the autopsy measures on
  batches = 1,             -- how many batches it averages over
  probe_text = 'In the beginning God created the heaven and the earth.',  -- the report's attention maps
  dtype = 'float32',
  seed = 1337,
  smoke = false,           -- a tiny random GPT-2 written here, for a quick check
  out = 'out/pretrained_autopsy',
}, arg, 'usage: anatomy examples/pretrained_autopsy.lua --model=NAME_OR_FOLDER [--key=value ...]')

-- A GPT-2 folder with random weights and a byte-level tokenizer of the 256
-- bytes (no merges): the files a Hugging Face checkpoint has, at toy size.
local function tiny_gpt2(dir)
  fs.mkdir(dir)
  local C, L, P = 32, 2, 64
  local byte_vocab = {}
  local bytes = {}
  for b = 33, 126 do bytes[#bytes + 1] = b end
  for b = 161, 172 do bytes[#bytes + 1] = b end
  for b = 174, 255 do bytes[#bytes + 1] = b end
  local printable = {}
  for _, b in ipairs(bytes) do printable[b] = true end
  local n = 0
  for b = 0, 255 do
    local cp = printable[b] and b or 256 + n
    if not printable[b] then n = n + 1 end
    local ch = cp < 128 and string.char(cp) or string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64)
    byte_vocab[ch] = b
  end
  fs.write_atomic(dir .. '/tokenizer.json', json.encode({
    version = '1.0', added_tokens = {}, normalizer = json.null, post_processor = json.null,
    pre_tokenizer = {type = 'ByteLevel', add_prefix_space = false, trim_offsets = true, use_regex = true},
    decoder = {type = 'ByteLevel'}, model = {type = 'BPE', dropout = json.null, vocab = byte_vocab, merges = {}}}))
  fs.write_atomic(dir .. '/config.json', json.encode({model_type = 'gpt2', vocab_size = 256, n_positions = P,
    n_embd = C, n_layer = L, n_head = 4, activation_function = 'gelu_new'}))
  torch.manual_seed(cfg.seed)
  local t = {['wte.weight'] = torch.randn(256, C) * 0.1, ['wpe.weight'] = torch.randn(P, C) * 0.1,
    ['ln_f.weight'] = torch.ones(C), ['ln_f.bias'] = torch.zeros(C)}
  for i = 0, L - 1 do
    local b = 'h.' .. i .. '.'
    for _, ln in ipairs{'ln_1', 'ln_2'} do t[b .. ln .. '.weight'] = torch.ones(C); t[b .. ln .. '.bias'] = torch.zeros(C) end
    t[b .. 'attn.c_attn.weight'] = torch.randn(C, 3 * C) * 0.1; t[b .. 'attn.c_attn.bias'] = torch.zeros(3 * C)
    t[b .. 'attn.c_proj.weight'] = torch.randn(C, C) * 0.1; t[b .. 'attn.c_proj.bias'] = torch.zeros(C)
    t[b .. 'mlp.c_fc.weight'] = torch.randn(C, 4 * C) * 0.1; t[b .. 'mlp.c_fc.bias'] = torch.zeros(4 * C)
    t[b .. 'mlp.c_proj.weight'] = torch.randn(4 * C, C) * 0.1; t[b .. 'mlp.c_proj.bias'] = torch.zeros(C)
  end
  torch.save_safetensors(dir .. '/model.safetensors', t)
  return dir
end

local folder = cfg.model
if cfg.smoke then
  folder = tiny_gpt2(cfg.out .. '/tiny-gpt2')
  cfg.seq = math.min(cfg.seq, 32)
elseif folder == '' then
  error('examples/pretrained_autopsy.lua: name a checkpoint with --model=ORG/NAME or --model=FOLDER (or --smoke=true)', 0)
end

torch.manual_seed(cfg.seed)
local model, tok = models.from_pretrained(folder, {dtype = cfg.dtype, revision = cfg.revision ~= '' and cfg.revision or nil})
if not tok then error(("examples/pretrained_autopsy.lua: '%s' has no tokenizer.json (or vocab.json and merges.txt)"):format(folder), 0) end
print(model)
print(('%s: %s parameters, tokenizer of %d tokens'):format(nn.typename(model), nn.format_count(model:num_parameters()), tok.vocab_size))
local seq = math.min(cfg.seq, model:context() or cfg.seq)

local path = cfg.data ~= '' and cfg.data or data.default_text()
local corpus = data.text(path, {tokenizer = tok})
print(corpus)

local a = autopsy.run(model, corpus, {steps = cfg.batches, batch = cfg.batch, seq = seq, probe_text = cfg.probe_text,
  config = cfg})
print()
print(a)
local json_path = a:json(cfg.out .. '/autopsy.json')
local html_path = a:report(cfg.out .. '/autopsy.html')
print(('\nreport: %s\ndata:   %s'):format(html_path, json_path))
print('\nprovenance: ' .. provenance.line(a.provenance))
