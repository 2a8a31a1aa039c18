-- What the probe layer takes as input: ids or texts turned into a batch of
-- ids, one token named by id or text, a position counted from either end,
-- and each token's text for labels.
local format = require('anatomy.render.format')
local inputs = {}

-- probe.to_ids(model, input, tokenizer, where) -> ids (B, T) int64 and the
-- tokenizer used. input: ids (T) or (B, T) (a tensor of another dtype is
-- passed on as it is), a text, or a list of texts of one length in tokens, with opts.tokenizer or the
-- model's own (models.from_pretrained sets model.tokenizer).
function inputs.to_ids(model, input, tokenizer, where)
  tokenizer = tokenizer or rawget(model, 'tokenizer')
  if torch.is_tensor(input) then
    if input.dtype ~= 'int64' then return input, tokenizer end  -- a model that takes vectors: as it is
    if input:dim() == 1 then input = input:unsqueeze(1) end
    if input:dim() ~= 2 then error(('%s: ids must be (T) or (B, T), got %s'):format(where, format.shape(input)), 3) end
    return input, tokenizer
  end
  local texts = type(input) == 'string' and {input} or input
  if type(texts) ~= 'table' or #texts == 0 then
    error(('%s: input must be ids (a Tensor), a text or a list of texts, got %s'):format(where, type(input)), 3)
  end
  if tokenizer == nil then
    error(('%s: a text needs a tokenizer: pass {tokenizer = tok} (a data.tokenizer or a corpus), or use a model from models.from_pretrained'):format(where), 3)
  end
  local rows = {}
  for i, t in ipairs(texts) do
    if type(t) ~= 'string' then error(('%s: input[%d] is a %s, not a string'):format(where, i, type(t)), 3) end
    rows[i] = tokenizer:encode(t)
    if rows[i]:size(1) ~= rows[1]:size(1) then
      error(('%s: the texts are %d and %d tokens long; a batch needs one length'):format(where, rows[1]:size(1), rows[i]:size(1)), 3)
    end
  end
  return torch.stack(rows, 1), tokenizer
end

-- inputs.token_id(v, tokenizer, where, what) -> one token id from a number (1-based id) or a text that is exactly one token.
local function token_id(v, tokenizer, where, what)
  if type(v) == 'number' then
    if v % 1 ~= 0 or v < 1 then error(('%s: %s must be a token id (a positive integer) or a one-token text, got %s'):format(where, what, v), 4) end
    return v
  end
  if type(v) ~= 'string' then error(('%s: %s must be a token id or a text, got %s'):format(where, what, type(v)), 4) end
  if not tokenizer then error(('%s: %s is text (%q); pass {tokenizer = tok} to turn it into an id'):format(where, what, v), 4) end
  local ids = tokenizer:encode(v, {add_special_tokens = false})  -- a corpus's encode takes the text alone
  if ids:numel() ~= 1 then error(('%s: %s (%q) is %d tokens, not one'):format(where, what, v, ids:numel()), 4) end
  return ids[1]:item()
end
inputs.token_id = token_id

-- inputs.token_texts(ids (B, T), tok) -> {{text, ...}, ...}: each token's text,
-- tok:decode of that one id (a BPE token's leading space kept), for a
-- tokenizer or a corpus; '#id' without one (the autopsy's maps use it too).
local function token_texts(ids, tok)
  local rows = {}
  if ids.dtype ~= 'int64' or ids:dim() ~= 2 then return rows end
  for b = 1, ids:size(1) do
    local row = {}
    for t = 1, ids:size(2) do
      local id = ids[b][t]:item()
      local ok, s = false, nil
      if type(tok) == 'table' and tok.decode then ok, s = pcall(tok.decode, tok, torch.tensor({id}, {dtype = 'int64'})) end
      row[t] = ok and s or ('#' .. id)
    end
    rows[b] = row
  end
  return rows
end

inputs.token_texts = token_texts

-- inputs.position(p, T, where[, context[, level]]) -> p as an index in
-- 1..T: p is 1-based, a negative p counts from the end (-1 is T); anything
-- else is an error ("position must be ... for <context>") at `level`
-- (default: the caller's caller).
function inputs.position(p, T, where, context, level)
  if type(p) ~= 'number' or p % 1 ~= 0 or p == 0 or p > T or p < -T then
    error(('%s: position must be an integer in 1..%d (or -%d..-1)%s, got %s'):format(where, T, T,
      context and ' for ' .. context or '', tostring(p)), (level or 2) + 1)
  end
  return p < 0 and T + p + 1 or p
end

return inputs
