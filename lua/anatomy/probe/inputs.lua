-- What the probe layer takes as input: ids or texts turned into a batch of
-- ids, one token named by id or text, a position counted from either end,
-- and each token's text for labels.
local torch = require('anatomy.torch')
local format = require('anatomy.render.format')
local inputs = {}

-- Rows of ids (1-D tensors) of any lengths as one batch: (B, T) ids, padded
-- with id 1 on `side` ('right' or 'left'), and the mask (B, T) bool, true
-- at real tokens; no mask when every row has one length.
local function pad_rows(rows, side, where)
  local longest, same = 0, true
  for _, r in ipairs(rows) do
    if r:numel() == 0 then error(('%s: an input of no tokens cannot be run'):format(where), 4) end
    if r:numel() ~= rows[1]:numel() then same = false end
    longest = math.max(longest, r:numel())
  end
  if same then return torch.stack(rows, 1), nil end
  local device = rows[1].device
  local ids = torch.ones(#rows, longest, {dtype = 'int64', device = device})
  local mask = torch.zeros(#rows, longest, {dtype = 'bool', device = device})
  for i, r in ipairs(rows) do
    local at = side == 'left' and longest - r:numel() + 1 or 1
    ids[i]:narrow(1, at, r:numel()):copy_(r)
    mask[i]:narrow(1, at, r:numel()):fill_(true)
  end
  return ids, mask
end

-- inputs.to_ids(model, input, tokenizer, where, padding_side) -> ids (B,
-- T) int64, the tokenizer used, and the padding mask (B, T) bool (true at
-- real tokens; nil when every example has one length). input: ids (T) or
-- (B, T) (a tensor of another dtype is passed on as it is), a list of 1-D
-- ids of any lengths, a text, or a list of texts of any lengths, with the
-- tokenizer given or the model's own (models.from_pretrained sets
-- model.tokenizer). Examples of different lengths are padded on
-- padding_side ('right', the default, or 'left') with id 1, which the mask
-- marks. Errors name `where`.
function inputs.to_ids(model, input, tokenizer, where, padding_side)
  tokenizer = tokenizer or rawget(model, 'tokenizer')
  local side = padding_side or 'right'
  if side ~= 'right' and side ~= 'left' then
    error(("%s: padding_side must be 'right' or 'left', got %s"):format(where, tostring(padding_side)), 3)
  end
  if torch.is_tensor(input) then
    if input.dtype ~= 'int64' then return input, tokenizer end  -- a model that takes vectors: as it is
    if input:dim() == 1 then input = input:unsqueeze(1) end
    if input:dim() ~= 2 then error(('%s: ids must be (T) or (B, T), got %s'):format(where, format.shape(input)), 3) end
    return input:to(model:device()), tokenizer
  end
  local texts = type(input) == 'string' and {input} or input
  if type(texts) ~= 'table' or #texts == 0 then
    error(('%s: input must be ids (a Tensor), a list of ids, a text or a list of texts, got %s'):format(where, type(input)), 3)
  end
  local rows = {}
  if torch.is_tensor(texts[1]) then
    for i, t in ipairs(texts) do
      if not torch.is_tensor(t) or t.dtype ~= 'int64' or t:dim() ~= 1 then
        error(('%s: input[%d] must be 1-D int64 ids like input[1], got %s'):format(where, i,
          torch.is_tensor(t) and (t.dtype .. ' ' .. format.shape(t)) or type(t)), 3)
      end
      rows[i] = t
    end
  else
    if tokenizer == nil then
      error(('%s: a text needs a tokenizer: pass {tokenizer = tok} (a data.tokenizer or a corpus), or use a model from models.from_pretrained'):format(where), 3)
    end
    for i, t in ipairs(texts) do
      if type(t) ~= 'string' then error(('%s: input[%d] is a %s, not a string'):format(where, i, type(t)), 3) end
      rows[i] = tokenizer:encode(t)
    end
  end
  local ids, mask = pad_rows(rows, side, where)
  local device = model:device()  -- a tokenizer's ids are on the CPU; the model reads them where it is
  return ids:to(device), tokenizer, mask and mask:to(device)
end

-- probe.to_ids(model, input, {tokenizer, padding_side = 'right'|'left'})
-- -> ids (B, T), tokenizer, mask: the batch the probe calls make of input
-- (inputs.to_ids): ids or texts, examples of any lengths padded with id 1
-- on padding_side, mask (B, T) bool true at real tokens (nil without
-- padding). For generate's attention_mask, pad on the left.
function inputs.public_to_ids(model, input, opts)
  opts = require('anatomy.torch.options').check(opts, {'tokenizer', 'padding_side'}, 'probe.to_ids', 2)
  local ids, tok, mask = inputs.to_ids(model, input, opts.tokenizer, 'probe.to_ids', opts.padding_side)
  return ids, tok, mask
end

-- inputs.check_mask(ids, mask, where) -> mask as (B, T) bool, or nil when
-- it marks every position real; an error naming both shapes otherwise.
function inputs.check_mask(ids, mask, where)
  if mask == nil then return nil end
  if not torch.is_tensor(mask) or mask:dim() ~= 2 or format.shape(mask) ~= format.shape(ids) then
    error(('%s: attention_mask must be (B, T) as the ids (%s), got %s'):format(where, format.shape(ids),
      torch.is_tensor(mask) and format.shape(mask) or type(mask)), 3)
  end
  if mask.dtype ~= 'bool' then mask = mask:ne(0) end
  if mask:all():item() then return nil end
  if not mask:any(2):all():item() then error(('%s: attention_mask has an example with no real token'):format(where), 3) end
  return mask
end

-- probe.forward(model, ids, mask) -> model(ids) with the padding mask set
-- on the model's blocks for this forward (model:set_padding) and taken off
-- after it, errors included; mask nil: model(ids). A model that cannot
-- take a padded batch (model:paddable()) is an error saying why.
function inputs.forward(model, ids, mask, where)
  where = where or 'probe.forward'
  if torch.is_tensor(ids) and ids:dim() == 2 then mask = inputs.check_mask(ids, mask, where) end
  if mask == nil then
    local out = model(ids)
    return out
  end
  local ok, why = model:paddable()
  if not ok then error(('%s: a padded batch (examples of different lengths), but %s'):format(where, why), 3) end
  model:set_padding(mask)
  local run_ok, out = pcall(model, ids)
  model:set_padding(nil)
  if not run_ok then error(out, 0) end
  return out
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
