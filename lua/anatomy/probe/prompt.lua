-- probe.test_prompt: how a model does on one prompt and its answer, as
-- TransformerLens's utilities.test_prompt prints it (the prompt and answer
-- token by token, the answer's rank, logit and probability at each of its
-- positions, the top-k tokens there), and returned as a table too.
local torch = require('anatomy.torch')
local options = require('anatomy.torch.options')

local prompt = {}

local function quoted(list)
  local out = {}
  for i, s in ipairs(list) do out[i] = ("'%s'"):format(s) end
  return '[' .. table.concat(out, ', ') .. ']'
end

-- probe.test_prompt(model, prompt, answer, {top_k = 10,
-- prepend_space_to_answer = true, prepend_bos = false, tokenizer, quiet})
-- -> {prompt_tokens, answer_tokens, answers = {{token, rank, logit, prob,
-- top = {{token, logit, prob}, ...}}, ...}}. answer: a text (its tokens
-- follow the prompt, each scored where it is predicted) or a list of texts
-- (their first tokens, each scored at the prompt's end). Ranks count from 1
-- (1 + the number of tokens more likely: the top token is rank 1, which
-- TransformerLens prints as 0); prob
-- is the softmax at that position. Prints unless quiet.
function prompt.test_prompt(model, text, answer, opts)
  local where = 'probe.test_prompt'
  opts = options.check(opts, {'top_k', 'prepend_space_to_answer', 'prepend_bos', 'tokenizer', 'quiet'}, where, 2)
  local tok = opts.tokenizer or rawget(model, 'tokenizer')
  if not tok then error(('%s: the model has no tokenizer; pass one as the tokenizer option'):format(where), 2) end
  if type(text) ~= 'string' then error(('%s: prompt must be a text, got %s'):format(where, type(text)), 2) end
  local answers = type(answer) == 'string' and {answer} or answer
  if type(answers) ~= 'table' or #answers == 0 then error(('%s: answer must be a text or a list of texts, got %s'):format(where, type(answer)), 2) end
  local top_k = options.whole(opts.top_k, 'top_k', where, 10, 0)
  for i, a in ipairs(answers) do
    if type(a) ~= 'string' or a == '' then error(('%s: answer %d must be a non-empty text, got %s'):format(where, i, tostring(a)), 2) end
    if opts.prepend_space_to_answer ~= false and a:sub(1, 1) ~= ' ' then answers[i] = ' ' .. a end
  end
  local prompt_ids = tok:encode(text)
  if opts.prepend_bos then
    if not tok.bos_token then error(('%s: prepend_bos: the tokenizer names no bos_token'):format(where), 2) end
    prompt_ids = torch.cat({torch.tensor({tok:token_to_id(tok.bos_token)}, {dtype = 'int64'}), prompt_ids})
  end
  local prompt_tokens = tok:to_str_tokens(prompt_ids)
  local multiple = #answers > 1
  local answer_ids, answer_tokens = {}, {}
  for i, a in ipairs(answers) do
    answer_ids[i] = tok:encode(a, {add_special_tokens = false})
    if answer_ids[i]:numel() == 0 then error(("%s: answer '%s' has no tokens"):format(where, a), 2) end
    if multiple then answer_ids[i] = answer_ids[i]:narrow(1, 1, 1) end
    answer_tokens[i] = tok:to_str_tokens(answer_ids[i])
  end
  local P, n = prompt_ids:size(1), answer_ids[1]:size(1)
  local result = {prompt_tokens = prompt_tokens, answer_tokens = multiple and answer_tokens or answer_tokens[1], answers = {}}
  local lines = {'Tokenized prompt: ' .. quoted(prompt_tokens)}
  if multiple then
    local shown = {}
    for i, t in ipairs(answer_tokens) do shown[i] = quoted(t) end
    lines[#lines + 1] = 'Tokenized answers: [' .. table.concat(shown, ', ') .. ']'
  else
    lines[#lines + 1] = 'Tokenized answer: ' .. quoted(answer_tokens[1])
  end
  local ranks = {}
  for i, ids in ipairs(answer_ids) do
    local full = torch.cat({prompt_ids, ids}):view(1, -1):to(model:device())  -- the model's device (a GPU)
    local logits = torch.no_grad(function() return model(full) end)[1]:double()  -- (T, V)
    for j = 1, n do
      local at = logits[P + j - 1]
      local probs = at:softmax(-1)
      local id = ids[j]:item()
      local rank = probs:gt(probs[id]):sum():item() + 1
      local entry = {token = answer_tokens[i][j], rank = rank, logit = at[id]:item(), prob = probs[id]:item(), position = P + j,
        top = {}}
      local values, indices = probs:topk(math.min(top_k, probs:size(1)))
      for k = 1, values:size(1) do
        local t = indices[k]:item()
        entry.top[k] = {token = tok:decode(torch.tensor({t}, {dtype = 'int64'})), logit = at[t]:item(), prob = values[k]:item()}
      end
      result.answers[#result.answers + 1] = entry
      ranks[#ranks + 1] = ("('%s', %d)"):format(entry.token, rank)
      lines[#lines + 1] = ('Performance on answer token%s:'):format(multiple and ' ' .. i or '')
      lines[#lines + 1] = ('Rank: %-8d Logit: %5.2f Prob: %6.2f%% Token: |%s|'):format(rank, entry.logit, 100 * entry.prob, entry.token)
      for k, t in ipairs(entry.top) do
        lines[#lines + 1] = ('Top %d token. Logit: %5.2f Prob: %6.2f%% Token: |%s|'):format(k, t.logit, 100 * t.prob, t.token)
      end
    end
  end
  lines[#lines + 1] = 'Ranks of the answer tokens: [' .. table.concat(ranks, ', ') .. ']'
  result.text = table.concat(lines, '\n')
  if not opts.quiet then print(result.text) end
  -- shown at the prompt after the report it printed: a line, not the report again
  local printed = not opts.quiet
  return setmetatable(result, {__tostring = function(r)
    if not printed then return r.text end
    return ('probe.test_prompt: %d answer token%s, ranks %s (the report is printed above; r.text holds it, r.answers each one)'):format(
      #r.answers, #r.answers == 1 and '' or 's', table.concat(ranks, ', '))
  end})
end

return prompt
