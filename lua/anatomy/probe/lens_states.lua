-- What a lens reads, shared by lens.lua (l:evaluate, lens.tuned) and the
-- per-text views (lens_views.lua): the ids and mask of an input, and the
-- residual stream at every row with the model's logits, from one forward.
local torch = require('anatomy.torch')
local hooks = require('anatomy.probe.hooks')
local scope = require('anatomy.probe.scope')
local inputs = require('anatomy.probe.inputs')
local format = require('anatomy.render.format')

local read = {}

-- ids and mask of an input (ids, a text, a list of texts or of ids).
-- Errors are raised at `level` (the user's call), without this file's position.
function read.batch_of(lens, input, opts, where, level)
  local ok, ids, tok, mask = pcall(inputs.to_ids, lens.model, input, opts.tokenizer, where, opts.padding_side)
  if not ok then error((tostring(ids):gsub('^[^\n]-:%d+: ', '')), level + 1) end
  if ids.dtype ~= 'int64' then error(('%s: input must be token ids or text, got %s ids'):format(where, ids.dtype), level + 1) end
  mask = inputs.check_mask(ids, mask, where)
  return ids, tok, mask
end

-- The residual stream at every row, detached: {[0] = embed, 1..N}, and the
-- model's logits, from one forward without gradients (under the padding
-- mask when there is one).
function read.states(lens, ids, mask, where)
  local model, layers = lens.model, select(1, lens.model:layers())
  local h = {}
  local logits = scope.run(model, function()
    for i, l in ipairs(layers) do
      hooks.replace(model, l[1], function(out, _, input)
        if i == 1 and torch.is_tensor(input) then h[0] = input:detach() end
        if torch.is_tensor(out) then h[i] = out:detach() end
      end)
    end
    return torch.no_grad(function() return inputs.forward(model, ids, mask, where) end)
  end)
  for i = 0, #layers do
    if not h[i] or h[i]:dim() ~= 3 or h[i]:size(-1) ~= h[#layers]:size(-1) then
      error(('%s: %s did not give a (B, T, C) residual stream as the others (got %s)'):format(where, lens.names[i + 1],
        h[i] and format.shape(h[i]) or 'nothing'), 0)
    end
  end
  return h, logits:detach()
end

return read
