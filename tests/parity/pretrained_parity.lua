-- Runs a Hugging Face folder through models.from_pretrained, for
-- test_pretrained_parity.py. arg: folder, text, out.json. Writes the ids, the
-- logits, every hidden state (the embeddings, each block, the final norm's),
-- every attention pattern, the loss and a greedy continuation. With arg[5] a
-- dtype ('bfloat16'), the model is loaded in it and only the logits are written.
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')
local model, tok = models.from_pretrained(arg[1], {dtype = arg[5]})
if arg[5] then
  local ids = tok:encode(arg[2]):unsqueeze(1)
  local logits = torch.no_grad(function() return model(ids) end)
  fs.write_atomic(arg[3], json.encode({dtype = logits.dtype, logits = logits[1]:float():tolist()}))
  os.exit(0)
end
local ids = tok:encode(arg[2]):unsqueeze(1)
local layers = model:layers()
local L = #layers
local names = {model.final_norm}
for _, l in ipairs(layers) do names[#names + 1] = l[1]; names[#names + 1] = l[1] .. '.*.pattern' end
local cap, logits = probe.capture(model, {filter = names}, function()
  return torch.no_grad(function() return model(ids) end)
end)
local T = ids:size(2)
local out = {ids = {}, hidden = {}, attentions = {}}
for i = 1, T do out.ids[i] = ids[1][i]:item() - 1 end
out.logits = logits[1]:tolist()
torch.no_grad(function() out.hidden[1] = model:embed(ids)[1]:tolist() end)
for i = 1, L - 1 do out.hidden[i + 1] = cap[layers[i][1]][1]:tolist() end
out.hidden[L + 1] = cap[model.final_norm][1]:tolist()  -- Hugging Face's last hidden state is after the final norm
for i, l in ipairs(layers) do
  for name, p in pairs(cap) do
    if name:sub(1, #l[1] + 1) == l[1] .. '.' and name:match('%.pattern$') then out.attentions[i] = p[1]:tolist() end
  end
end
-- the same through probe.run_with_cache with every hook point on (each block's
-- explicit path): the residual stream, the patterns, the logits; and each
-- attention's per-head results summed with the output bias against its output
do
  local hooked, cache = probe.run_with_cache(model, ids, {filter = {'*', '*.result'}})
  out.cache_logits = hooked[1]:tolist()
  out.cache_hidden = {cache[layers[1][1] .. '.resid_pre'][1]:tolist()}
  for i = 1, L - 1 do out.cache_hidden[i + 1] = cache[layers[i][1] .. '.resid_post'][1]:tolist() end
  out.cache_attentions = {}
  local patterns = cache:stack('pattern')
  for i = 1, L do out.cache_attentions[i] = patterns[i][1]:tolist() end
  out.result_gap = 0
  for _, name in ipairs(cache:names()) do
    local attn = name:match('^(.*)%.result$')
    if attn then
      local bias
      for n, p in model:named_parameters() do
        if n == attn .. '.o.bias' or n == attn .. '.proj.bias' then bias = p end
      end
      local sum = cache[name]:sum(3)
      if bias then sum = sum + bias end
      out.result_gap = math.max(out.result_gap, (sum - cache[attn]):abs():max():item())
    end
  end
end
out.loss = nn.functional.cross_entropy(logits:narrow(2, 1, T - 1), ids:narrow(2, 2, T - 1)):item()
local gen = model:generate(ids, {max_new = 8, temperature = 0})
out.generated = {}
for i = 1, gen:size(2) do out.generated[i] = gen[1][i]:item() - 1 end
out.names = {}
for name in model:named_parameters() do out.names[#out.names + 1] = name end
-- edited, then written back for transformers to load: the final norm's gain
-- scaled, so the saved model is not the one that was read
if arg[4] then
  torch.no_grad(function()
    for name, p in model:named_parameters() do if name == model.final_norm .. '.weight' then p:mul_(1.5) end end
  end)
  model:save_pretrained(arg[4])
  out.edited_logits = torch.no_grad(function() return model(ids) end)[1]:tolist()
end
fs.write_atomic(arg[3], json.encode(out))
