-- data.tokenizer: byte-level BPE on a tokenizer.json written here, with
-- encodings worked out by hand (the parity test compares with Hugging Face's
-- `tokenizers` where it is installed), and the refusals of what it does not do.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require 'harness'
local test, eq, raises = H.test, H.eq, H.raises
local json = require 'anatomy.json'

-- GPT-2's byte map: printable bytes stand for themselves, space is 'Ġ' (U+0120), newline 'Ċ' (U+010A).
local function write_tokenizer(spec)
  local path = os.tmpname()
  local f = assert(io.open(path, 'wb'))
  f:write(json.encode(spec))
  f:close()
  return path
end

local function base_spec()
  local vocab = {}
  local n = 0
  for _, t in ipairs{'a', 'b', 'c', 'h', 'e', 'l', 'o', '!', 'Ġ', 'Ċ', '1', '2', '3'} do vocab[t] = n; n = n + 1 end
  for _, t in ipairs{'he', 'll', 'hell', 'hello', 'Ġhello', 'ab'} do vocab[t] = n; n = n + 1 end
  return {
    version = '1.0',
    added_tokens = {{id = n, content = '<|end|>', special = true, lstrip = false, rstrip = false, single_word = false, normalized = false}},
    normalizer = json.null, pre_tokenizer = {type = 'ByteLevel', add_prefix_space = false, trim_offsets = true, use_regex = true},
    post_processor = json.null, decoder = {type = 'ByteLevel', add_prefix_space = true, trim_offsets = true, use_regex = true},
    model = {type = 'BPE', dropout = json.null, unk_token = json.null, fuse_unk = false, byte_fallback = false, ignore_merges = false,
      vocab = vocab, merges = {{'h', 'e'}, {'l', 'l'}, {'he', 'll'}, {'hell', 'o'}, {'Ġ', 'hello'}, {'a', 'b'}}},
  }
end

-- A template that puts <|end|> (id 19 in the file) before each text.
local end_first_template = {type = 'TemplateProcessing',
  single = {{SpecialToken = {id = '<|end|>', type_id = 0}}, {Sequence = {id = 'A', type_id = 0}}},
  pair = {}, special_tokens = {['<|end|>'] = {id = '<|end|>', ids = {19}, tokens = {'<|end|>'}}}}

test('encode: pieces by the split pattern, merges by rank; ids 1-based', function()
  local path = write_tokenizer(base_spec())
  local tok = data.tokenizer(path)
  eq(tok.vocab_size, 20)
  -- 1-based ids: a 1 .. 3 13, he 14, ll 15, hell 16, hello 17, Ġhello 18, ab 19, <|end|> 20
  -- 'hello' -> he, ll -> hell -> hello; ' hello' -> Ġhello
  eq(tok:encode('hello hello'):tolist(), {17, 18})
  -- 'abc' -> ab + c; '!' alone; '123' is one \p{N}+ piece without merges: 1, 2, 3
  eq(tok:encode('abc!123'):tolist(), {19, 3, 8, 11, 12, 13})
  eq(tok:encode('hello<|end|>hello'):tolist(), {17, 20, 17}, 'the added token is never split')
  eq(tok:decode({17, 20, 18}), 'hello<|end|> hello')
  eq(tok:decode({17, 20, 18}, {skip_special_tokens = true}), 'hello hello')
  eq(tok:token_to_id('Ġhello'), 18)
  eq(tok:id_to_token(18), 'Ġhello')
  eq(tok:id_to_token(999), nil)
  eq(tok:encode(''):numel(), 0)
  raises(function() tok:encode('z') end, "bad argument #1 to 'encode' (the piece 'z' is not in the vocabulary and the tokenizer has no unk_token)")
  raises(function() tok:decode({0}) end, "bad argument #1 to 'decode' (token id 0 is out of range 1..20)")
  raises(function() tok:encode(3) end, "bad argument #1 to 'encode' (string expected, got number)")
  os.remove(path)
end)

test('a template adds special tokens; add_special_tokens = false leaves them out', function()
  local spec = base_spec()
  spec.post_processor = end_first_template
  local path = write_tokenizer(spec)
  local tok = data.tokenizer(path)
  eq(tok:encode('hello'):tolist(), {20, 17})
  eq(tok:encode('hello', {add_special_tokens = false}):tolist(), {17})
  os.remove(path)
end)

test('what it does not do is refused by name', function()
  local cases = {
    {function(s) s.model.type = 'WordPiece' end, "model.type is 'WordPiece'; only BPE is supported"},
    {function(s) s.normalizer = {type = 'Lowercase'} end, "normalizer is 'Lowercase'; supported: NFC (Qwen2)"},
    {function(s) s.pre_tokenizer = {type = 'Metaspace'} end, "pre_tokenizer is 'Metaspace'; supported: ByteLevel, or a Sequence of Split and ByteLevel"},
    {function(s) s.model.byte_fallback = true end, 'model.byte_fallback is true (a SentencePiece-style BPE); load its tokenizer.model instead'},
    {function(s) s.decoder = {type = 'WordPiece'} end, "decoder is 'WordPiece'; only ByteLevel is supported"},
    {function(s) s.pre_tokenizer = {type = 'Sequence', pretokenizers = {{type = 'Split', pattern = {Regex = '(unclosed'}, behavior = 'Isolated'}, {type = 'ByteLevel', use_regex = false}}} end,
      'the split pattern does not compile at offset 9: missing closing parenthesis'},
  }
  for _, c in ipairs(cases) do
    local spec = base_spec()
    c[1](spec)
    local path = write_tokenizer(spec)
    raises(function() data.tokenizer(path) end, c[2])
    os.remove(path)
  end
  raises(function() data.tokenizer('/no/such/tokenizer.json') end, "cannot open '/no/such/tokenizer.json'")
  local bad = os.tmpname()
  local f = io.open(bad, 'wb'); f:write('{"model": '); f:close()
  raises(function() data.tokenizer(bad) end, "' is not valid JSON: parse error at line 1, column 11: syntax error while parsing value - unexpected end of input; expected '[', '{', or a literal")
  os.remove(bad)
  local dir = os.tmpname()
  os.remove(dir)
  os.execute("mkdir -p '" .. dir .. "'")
  raises(function() data.tokenizer(dir) end, "holds neither tokenizer.json nor vocab.json and merges.txt")
  os.execute("rmdir '" .. dir .. "'")
end)

test('a corpus read with the tokenizer: ids without the template, decoded back to the text', function()
  local spec = base_spec()
  spec.post_processor = end_first_template
  local path = write_tokenizer(spec)
  local tok = data.tokenizer(path)
  local text_path = os.tmpname()
  local f = io.open(text_path, 'wb'); f:write(('hello abc! '):rep(30)); f:close()
  local c = data.text(text_path, {tokenizer = tok, split = 0.5})
  eq(c.tokenizer, 'bpe')
  eq(c.vocab_size, 20)
  eq(c:decode(c:tokens()), ('hello abc! '):rep(30), 'no BOS inside a running text')
  -- 'hello' -> hello; ' abc' -> Ġ, ab, c (no merge makes Ġab); '!' -> !
  eq(c:tokens():narrow(1, 1, 5):tolist(), {17, 9, 19, 3, 8})
  os.remove(text_path)
  os.remove(path)
end)

H.done()
