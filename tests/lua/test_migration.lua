-- docs/pretrained.md's "Coming from TransformerLens": every anatomy cell of
-- the table runs, as written, on a GPT-2 checkpoint; a row whose code
-- fails (a renamed function, a wrong option) fails here.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq = H.test, H.eq
local fs = require('anatomy.io.fs')
local json = require('anatomy.io.json')

local here = arg[0]:match('^(.*)/') or '.'
local doc = fs.read(here .. '/../../docs/pretrained.md')

-- The table's rows: {transformer_lens, anatomy code}
local function rows()
  local section = doc:match('\n## Coming from TransformerLens\n(.-)\n## ')
  assert(section, 'docs/pretrained.md has no section "Coming from TransformerLens"')
  local out = {}
  for line in section:gmatch('[^\n]+') do
    local left, right = line:match('^| (.-) | (.-) |$')
    if left and left ~= 'TransformerLens' and not left:match('^%-%-%-') then
      local code = right:match('^`(.-)`')
      assert(code, 'a row without code in its anatomy cell: ' .. line)
      out[#out + 1] = {left, code}
    end
  end
  return out
end

-- A GPT-2 checkpoint with a tiny byte-level tokenizer of its 11 tokens.
local function checkpoint()
  local dir = H.gpt2_folder()
  fs.write_atomic(dir .. '/vocab.json', json.encode({['<|endoftext|>'] = 0, a = 1, b = 2, c = 3, d = 4, e = 5, ['Ġ'] = 6,
    ['Ġa'] = 7, ab = 8, ['Ġb'] = 9, cd = 10}))
  fs.write_atomic(dir .. '/merges.txt', '#version: 0.2\na b\nĠ a\nĠ b\nc d\n')
  fs.write_atomic(dir .. '/tokenizer_config.json', json.encode({bos_token = '<|endoftext|>', eos_token = '<|endoftext|>',
    tokenizer_class = 'GPT2Tokenizer'}))
  return dir
end

test('every anatomy cell of the TransformerLens table runs as written', function()
  local folder = checkpoint()
  local model, tok = models.from_pretrained(folder)
  local ids = tok:encode('ab cd ab cd'):view(1, -1):to(model:device())
  local corrupt = tok:encode('cd ab cd ab'):view(1, -1):to(model:device())
  eq(ids:size(), corrupt:size(), 'clean and corrupt of one length')
  local diff = patching.logit_diff(2, 3)
  local env = setmetatable({model = model, tok = tok, ids = ids, corrupt = corrupt, folder = folder,
    metric = function(l, m) return diff(l, m):item() end, metric_t = diff, fn = function(t) return t end}, {__index = _G})
  -- an SAE at the first layer's output, saved as SAELens has it
  local s = sae.new{d_in = 8, d_sae = 16, point = 'h.1.resid_post'}
  env.sae_folder = s:save(H.tmpdir() .. '/sae', {model = model})
  local list = rows()
  assert(#list >= 20, ('the table has %d rows'):format(#list))
  for _, r in ipairs(list) do
    local code = r[2]
    local chunk = load('return ' .. code, '=' .. code, 't', env) or load(code, '=' .. code, 't', env)
    assert(chunk, 'does not parse: ' .. code)
    local ok, a = pcall(chunk)
    if not ok then error(('the row for %s: %s\n  %s'):format(r[1], code, tostring(a)), 0) end
  end
  eq(#probe.list(model), 0, 'the rows leave nothing attached')
  -- test_prompt prints its report once: shown at the prompt, its result is a line, not the report again
  local quiet = probe.test_prompt(model, 'ab cd', ' a', {tokenizer = tok, quiet = true})
  eq(tostring(quiet), quiet.text, 'quiet: the result prints the report')
  local printed = probe.test_prompt(model, 'ab cd', ' a', {tokenizer = tok})
  assert(tostring(printed):find('^probe.test_prompt: 1 answer token, ranks'), tostring(printed))
  -- the names the table promises
  eq(sae.load(env.sae_folder).cfg.hook_name, 'blocks.0.hook_resid_post')
  H.close(env.cache['blocks.0.attn.hook_pattern'], env.cache['h.1.attn.pattern'], 0, "TransformerLens's layer 0 is anatomy's h.1")
end)

H.done()
