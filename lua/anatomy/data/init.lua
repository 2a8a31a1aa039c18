-- data: text corpora for training. A corpus is a tokenized text (the file is
-- memory-mapped, never read into a Lua string) with a train/val split, and
-- hands out random windows as batches. Token ids are 1-based.
local torch = require('anatomy.torch')
local natives = require('anatomy.torch.native')
local data = {}
local native = require('anatomy.torch.native').data
local options = require('anatomy.torch.options')
local fs = require('anatomy.io.fs')
local json = require('anatomy.io.json')
local hub = require('anatomy.io.hub')

local Corpus = {}
Corpus.__index = Corpus
data.Corpus = Corpus

local function check_options(opts, allowed, where) return options.check(opts, allowed, where, 3) end

local function wrap(handle, source)
  return setmetatable({_native = handle, source = source, vocab_size = handle:vocab_size(),
    tokenizer = handle:tokenizer()}, Corpus)
end

-- data.text(path, {tokenizer = 'char'|'byte'|'sentencepiece', vocab_size = 4000,
--   type = 'bpe'|'unigram', model = 'file.model', split = 0.9}) -> corpus
-- SentencePiece trains on the text the first time (or loads `model`) and
-- caches the model beside the text (~/.cache/anatomy if that is read-only).
-- tokenizer may also be a data.Tokenizer (a pretrained model's: the text's ids
-- without the template's special tokens).
function data.text(path, opts)
  opts = check_options(opts, {tokenizer = true, vocab_size = true, type = true, model = true, split = true}, 'data.text')
  local tok, given = opts.tokenizer, nil
  if getmetatable(tok) == data.Tokenizer then tok, given = tok._native, tok end
  local c = wrap(native.text(path, tok or 'char', opts.split, opts.vocab_size, opts.type, opts.model), path)
  c.read_with = given  -- the pretrained tokenizer its ids are from (autopsy.run checks it is the model's)
  return c
end

-- data.from_string(text, {tokenizer = 'char'|'byte', split = 0.9}): a corpus from text in memory
function data.from_string(text, opts)
  opts = check_options(opts, {tokenizer = true, split = true}, 'data.from_string')
  local c = wrap(native.from_string(text, opts.tokenizer or 'char', opts.split), '(string)')
  c._file_info = {name = '(string)', path = '(string)', bytes = #text, sha256 = native.sha256(text)}
  return c
end

-- data.default_text() -> the path of the default corpus: the King James Bible
-- (public domain) from Debian's bible-kjv package, dumped once with its
-- `bible` program into the cache folder, one verse per line, references stripped.
function data.default_text()
  local dir = natives.cache_dir()  -- XDG_CACHE_HOME honoured, as for trained tokenizers
  local path = dir .. '/kjv.txt'
  if fs.exists(path) then return path end
  local probe = io.popen('command -v bible 2>/dev/null')
  local found = probe:read('*l')
  probe:close()
  if not found or found == '' then
    error('the default corpus needs the `bible` program from Debian\'s bible-kjv package\n'
      .. '---> HINT: apt-get install bible-kjv (scripts/setup does), or pass a text with --data=FILE', 2)
  end
  local pipe = io.popen('bible -l100000 gen1:1-rev22:21')
  local verses = {}
  for line in pipe:lines() do
    local verse = line:match('^ +%d+ (.*)$')        -- "  12 And God said..." ; chapter headings are skipped
    if verse then verses[#verses + 1] = verse end
  end
  pipe:close()
  if #verses < 30000 then error(('the bible program gave %d verses, expected 31102'):format(#verses), 2) end
  return fs.write_atomic(path, table.concat(verses, '\n') .. '\n')
end

-- corpus:batch(B, T, {split = 'train'|'val', device}) -> inputs (B, T), targets (B, T):
-- B random windows of T tokens, and the same windows one token later.
-- device: where they go (default: torch.device()). On a GPU the windows go
-- through pinned memory and are copied without waiting: the copy overlaps the
-- work already queued.
function Corpus:batch(B, T, opts)
  opts = check_options(opts, {split = true, device = true}, 'batch')
  local x, y = self._native:batch(B, T, opts.split or 'train')
  local device = opts.device or torch.device()
  if device:match('^cuda') then
    x = x:pin_memory():to({device = device, non_blocking = true})
    y = y:pin_memory():to({device = device, non_blocking = true})
  elseif device ~= 'cpu' then
    x, y = x:to(device), y:to(device)
  end
  return x, y
end

-- corpus:encode(text) -> int64 ids (1-based); corpus:decode(ids) -> text
-- (no tail calls: errors keep the method's name and argument numbers)
function Corpus:encode(text)
  local ids = self._native:encode(text)
  return ids
end

-- corpus:decode(ids) -> the text of token ids (a Tensor or a list; 1-based ids)
function Corpus:decode(ids)
  local text = self._native:decode(ids)
  return text
end

-- corpus:file_info() -> {name, path (absolute), bytes, sha256} of the text it
-- was read from (computed once; a corpus from a string reports the string's)
function Corpus:file_info()
  self._file_info = self._file_info or data.file_info(self.source)
  return self._file_info
end

-- data.sha256(s) -> the SHA-256 of a string's bytes, as 64 hex digits
data.sha256 = native.sha256

-- data.file_info(path) -> {name, path (absolute), bytes, sha256}: a file's
-- identity (provenance.file)
data.file_info = require('anatomy.io.provenance').file

-- corpus:tokens([split]) -> the ids of the whole text or of one split
function Corpus:tokens(split) return self._native:tokens(split) end

-- corpus:size([split]) -> number of tokens
function Corpus:size(split) return self._native:tokens(split):numel() end

function Corpus:__tostring()
  return ('data.Corpus(%s, %s tokenizer, vocab %d, %d train + %d val tokens)'):format(
    self.source, self.tokenizer, self.vocab_size, self:size('train'), self:size('val'))
end

-- A pretrained model's BPE tokenizer, as Hugging Face's `tokenizers` applies
-- it (host/io/bpe.cpp): byte-level (GPT-2, GPT-J, Pythia, Llama 3, Qwen2/3,
-- OLMo 2) or SentencePiece-style with byte fallback (Llama 2, Mistral,
-- TinyLlama, Phi-3, Gemma 2/3). Ids are 1-based: Hugging Face's id i is
-- anatomy's i + 1.
local Tokenizer = {}
Tokenizer.__index = Tokenizer
data.Tokenizer = Tokenizer

-- A SentencePiece tokenizer.model as transformers' LlamaTokenizer reads it,
-- with tokenizer_config.json's add_bos_token, add_eos_token,
-- add_prefix_space and legacy where the folder has one.
local function from_sentencepiece(folder, model)
  local settings = {}
  local config_path = folder .. '/tokenizer_config.json'
  if fs.exists(config_path) then
    local text = fs.read(config_path)
    local ok, config = pcall(json.decode, text)
    if not ok or type(config) ~= 'table' then
      error(("data.tokenizer: '%s' is not valid JSON: %s"):format(config_path, tostring(config)), 3)
    end
    local class = config.tokenizer_class
    if class ~= nil and class ~= 'LlamaTokenizer' and class ~= 'LlamaTokenizerFast' then
      error(("data.tokenizer: '%s' has tokenizer_class = %s; a tokenizer.model alone is read as LlamaTokenizer "
        .. "(Llama, Mistral) only"):format(config_path, tostring(class)), 3)
    end
    for _, key in ipairs {'add_bos_token', 'add_eos_token', 'add_prefix_space', 'legacy'} do
      local v = config[key]
      if v ~= nil and type(v) ~= 'boolean' then
        error(("data.tokenizer: '%s': %s must be true or false, got %s"):format(config_path, key, tostring(v)), 3)
      end
      settings[key] = v
    end
  end
  return natives.data._bpe_from_sentencepiece(model, settings.add_bos_token, settings.add_eos_token,
    settings.add_prefix_space, settings.legacy)
end

-- The tokens transformers 5 makes special on top of tokenizer.json's own:
-- those tokenizer_config.json names (bos_token, ..., mask_token,
-- additional_special_tokens, extra_special_tokens), and the ones its class
-- names by default where the file names none (GemmaTokenizer's <mask>, which
-- Gemma's tokenizer.json has as a plain added token). decode skips them with
-- skip_special_tokens, as transformers does. A set of 1-based ids, or nil.
local named_keys = {'bos_token', 'eos_token', 'unk_token', 'sep_token', 'pad_token', 'cls_token', 'mask_token'}
local class_defaults = {
  GemmaTokenizer = {pad_token = '<pad>', eos_token = '<eos>', bos_token = '<bos>', unk_token = '<unk>', mask_token = '<mask>'},
  LlamaTokenizer = {unk_token = '<unk>', bos_token = '<s>', eos_token = '</s>'},
  Qwen2Tokenizer = {unk_token = '<|endoftext|>', eos_token = '<|endoftext|>', pad_token = '<|endoftext|>'},
  GPT2Tokenizer = {unk_token = '<|endoftext|>', bos_token = '<|endoftext|>', eos_token = '<|endoftext|>'},
}
local function named_special(native, config)
  local class = type(config.tokenizer_class) == 'string' and config.tokenizer_class:gsub('Fast$', '') or nil
  local defaults = class_defaults[class] or {}
  local set, any = {}, false
  local function add(v)
    if type(v) == 'table' then v = v.content end
    local id = type(v) == 'string' and native:token_to_id(v)
    if id then set[id], any = true, true end
  end
  for _, key in ipairs(named_keys) do
    if config[key] == nil then add(defaults[key]) else add(config[key]) end
  end
  for _, key in ipairs {'additional_special_tokens', 'extra_special_tokens'} do
    if type(config[key]) == 'table' then
      for _, v in pairs(config[key]) do add(v) end
    end
  end
  return any and set or nil
end

-- data.tokenizer(path, {revision, token, cache_dir, local_files_only}) ->
-- tok: path is a tokenizer.json, or a folder holding tokenizer.json, GPT-2's
-- vocab.json + merges.txt, or a SentencePiece tokenizer.model (read as
-- transformers' LlamaTokenizer reads it), first found first; or a Hub
-- repository id whose tokenizer files are fetched (as models.from_pretrained).
function data.tokenizer(path, opts)
  if type(path) ~= 'string' then error(('data.tokenizer: path must be a string, got %s'):format(type(path)), 2) end
  opts = check_options(opts, {revision = true, token = true, cache_dir = true, local_files_only = true}, 'data.tokenizer')
  local native
  local name = path
  if not fs.exists(path) and not path:match('%.json$') and not path:match('%.model$') and hub.is_repo_id(path) then
    local ok, snap = pcall(hub.fetch_tokenizer, path, {revision = opts.revision, token = opts.token,
      cache_dir = opts.cache_dir, local_files_only = opts.local_files_only, where = 'data.tokenizer'})
    if not ok then error(snap, 2) end
    path = snap.folder
  elseif next(opts) then
    local k = next(opts)
    error(("data.tokenizer: option '%s' is for a Hub repository id, and '%s' is a local path"):format(k, path), 2)
  end
  if fs.is_dir(path) then
    local json_path, vocab, merges, model = path .. '/tokenizer.json', path .. '/vocab.json', path .. '/merges.txt',
      path .. '/tokenizer.model'
    if fs.exists(json_path) then native = natives.data._bpe_from_json(json_path)
    elseif fs.exists(vocab) and fs.exists(merges) then native = natives.data._bpe_from_vocab_merges(vocab, merges)
    elseif fs.exists(model) then native = from_sentencepiece(path, model)
    else error(("data.tokenizer: '%s' holds none of tokenizer.json, vocab.json and merges.txt, tokenizer.model"):format(path), 2) end
  elseif path:match('%.model$') then
    native = from_sentencepiece(path:match('^(.*)/[^/]*$') or '.', path)
  else
    native = natives.data._bpe_from_json(path)
  end
  local tok = setmetatable({_native = native, vocab_size = native:vocab_size(), path = name}, Tokenizer)
  local folder = fs.is_dir(path) and path or fs.dirname(path)
  local config = folder and folder .. '/tokenizer_config.json'
  if config and fs.exists(config) then
    local ok, c = pcall(json.decode, fs.read(config))
    if ok and type(c) == 'table' then
      -- the BOS token it names (to_str_tokens' prepend_bos), when it is in the vocabulary
      local bos = type(c.bos_token) == 'table' and c.bos_token.content or c.bos_token
      if type(bos) == 'string' and native:token_to_id(bos) then tok.bos_token = bos end
      tok._named_special = named_special(native, c)
    end
  end
  return tok
end

-- tok:to_str_tokens(text_or_ids, {prepend_bos = false}) -> each token's
-- text, decoded alone ({'The', ' quick', ...}), as TransformerLens's
-- to_str_tokens; prepend_bos puts tokenizer_config.json's bos_token first
-- (TransformerLens does by default; anatomy's encode adds what the
-- tokenizer's own template adds, nothing more).
function Tokenizer:to_str_tokens(input, opts)
  opts = check_options(opts, {prepend_bos = true}, 'to_str_tokens')
  local ids
  if type(input) == 'string' then ids = self:encode(input)
  elseif torch.is_tensor(input) then ids = input:reshape(-1)
  else error(('to_str_tokens: the input must be a text or token ids, got %s'):format(type(input)), 2) end
  local out = {}
  if opts.prepend_bos then
    if not self.bos_token then error(("to_str_tokens: prepend_bos: the tokenizer %s names no bos_token"):format(tostring(self.path)), 2) end
    out[1] = self.bos_token
  end
  for i = 1, ids:numel() do out[#out + 1] = self:decode(ids:narrow(1, i, 1)) end
  return out
end

-- tok:encode(text, {add_special_tokens = true}) -> int64 ids (1-based), with
-- the special tokens the tokenizer's post-processor adds (a BOS, say).
function Tokenizer:encode(text, opts)
  opts = check_options(opts, {add_special_tokens = true}, 'encode')
  local ids = self._native:encode(text, opts.add_special_tokens ~= false)
  return ids
end

-- tok:decode(ids, {skip_special_tokens = false}) -> text
function Tokenizer:decode(ids, opts)
  opts = check_options(opts, {skip_special_tokens = true}, 'decode')
  local skip, named = opts.skip_special_tokens == true, self._named_special
  if skip and named and (type(ids) == 'table' or (torch.is_tensor(ids) and ids:dim() == 1)) then
    local kept = {}
    for _, id in ipairs(torch.is_tensor(ids) and ids:tolist() or ids) do
      if not named[id] then kept[#kept + 1] = id end
    end
    ids = kept
  end
  local text = self._native:decode(ids, skip)
  return text
end

-- tok:token_to_id('Ġthe') -> id or nil; tok:id_to_token(id) -> string or nil
function Tokenizer:token_to_id(token) local id = self._native:token_to_id(token) return id end
-- tok:id_to_token(id) -> the token's string (its vocabulary entry, 'Ġthe'), or nil
function Tokenizer:id_to_token(id) local token = self._native:id_to_token(id) return token end

function Tokenizer:__tostring()
  return ('data.Tokenizer(byte-level BPE, %d tokens, %s)'):format(self.vocab_size, self.path)
end

return data
