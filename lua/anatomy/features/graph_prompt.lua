-- A text prompt for sae.attribute, tokenized as circuit-tracer 0.5.0's
-- ensure_tokenized does it: the text's ids without the template's special
-- tokens, then a BOS stand-in put first unless the text already starts
-- with a special token. The stand-in is the first the tokenizer names of
-- bos_token, pad_token, eos_token, else its smallest special id; a
-- tokenizer with none (a char-level corpus) puts nothing first, and the
-- text's first token is the position sae.attribute leaves out, as
-- circuit-tracer does after its warning.
local torch = require('anatomy.torch')
local data = require('anatomy.data')

local M = {}

-- The id (1-based) of the token a tokenizer puts first, or nil
local function bos_id(tok)
  for _, key in ipairs{'bos_token', 'pad_token', 'eos_token'} do
    local name = rawget(tok, key)
    local id = type(name) == 'string' and type(tok.token_to_id) == 'function' and tok:token_to_id(name)
    if id then return id end
  end
  local special = rawget(tok, '_named_special')
  if type(special) == 'table' then
    local low
    for id in pairs(special) do if not low or id < low then low = id end end
    return low
  end
  return nil
end

-- M.ids(model, prompt, tokenizer, where, level) -> prompt as it was when it
-- is no text, else its ids (int64, 1-D) with the BOS stand-in first.
-- tokenizer: the option, else the model's own (models.from_pretrained's).
function M.ids(model, prompt, tokenizer, where, level)
  if type(prompt) ~= 'string' then return prompt end
  local tok = tokenizer or rawget(model, 'tokenizer')
  if tok == nil then
    error(('%s: a text prompt needs a tokenizer: pass {tokenizer = tok} (a data.tokenizer or a corpus), '
      .. 'or use a model from models.from_pretrained'):format(where), level + 1)
  end
  if type(tok) ~= 'table' or type(tok.encode) ~= 'function' then
    error(('%s: tokenizer must be a data.tokenizer or a corpus (one with :encode), got %s'):format(where, type(tok)), level + 1)
  end
  local ids
  if getmetatable(tok) == data.Tokenizer then
    ids = tok:encode(prompt, {add_special_tokens = false})
  else
    ids = tok:encode(prompt)
  end
  ids = ids:reshape(-1):long()
  if ids:numel() == 0 then error(('%s: the prompt %q has no tokens'):format(where, prompt), level + 1) end
  local special = rawget(tok, '_named_special')
  if type(special) == 'table' and special[ids[1]:item()] then return ids end
  local bos = bos_id(tok)
  if bos then ids = torch.cat({ids:narrow(1, 1, 1):clone():fill_(bos), ids}) end
  return ids
end

return M
