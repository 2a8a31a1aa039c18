-- models: the architectures anatomy dissects, written in Lua from nn blocks.
local torch = require('anatomy.torch')
local nn = require('anatomy.nn')
local options = require('anatomy.torch.options')
local models = {}
package.loaded['anatomy.models'] = models

local vibenet = require('anatomy.models.vibenet')
models.vibenet = vibenet.new
models.vibe_head = vibenet.vibe_head
models.gpt = require('anatomy.models.gpt').new
models.funnel = require('anatomy.models.funnel').new
models.stateful = require('anatomy.models.stateful').new
-- Hugging Face folders: models.from_pretrained, and the translation of names
local pretrained = require('anatomy.models.pretrained')
models.pretrained = pretrained
models.from_pretrained = pretrained.from_pretrained
models.from_config = pretrained.from_config
models.process_weights = require('anatomy.models.process').process_weights
models.hf_name = pretrained.hf_name
models.anatomy_name = pretrained.anatomy_name

-- models.llama{vocab, dim, heads, layers, ffn, ...}: lua/anatomy/models/llama.lua
function models.llama(cfg)
  local m = require('anatomy.models.llama').new(cfg)  -- lazy: the families load on first use
  return m
end

-- models.check_ids(model, ids): a model's input is token ids (B, T) of
-- int64; text, 1-D ids or floats are an error at the user's line that says
-- what to pass (what would otherwise fail deep inside the first block).
function models.check_ids(model, ids)
  local where = nn.typename(model)
  if type(ids) == 'string' then
    error(("%s: the input is text ('%s'); a model takes token ids (B, T): tok:encode(text), or probe.to_ids(model, text, "
      .. "{tokenizer = tok}) (probe.run_with_cache and probe.test_prompt take text themselves)"):format(where,
      #ids > 24 and ids:sub(1, 24) .. '...' or ids), options.user_level())
  end
  if not torch.is_tensor(ids) then
    error(('%s: the input must be token ids (B, T), an int64 Tensor, got %s'):format(where, nn.typename(ids)), options.user_level())
  end
  if ids.dtype ~= 'int64' then
    error(('%s: token ids must be int64, got %s (ids:long() converts whole numbers)'):format(where, ids.dtype), options.user_level())
  end
  if ids:dim() ~= 2 then
    error(('%s: token ids must be (B, T), got %s%s'):format(where, ids:dim() == 0 and 'a scalar' or table.concat(ids:size(), 'x'),
      ids:dim() == 1 and ': ids:unsqueeze(1) makes a batch of one' or ''), options.user_level())
  end
end

-- Checks a config table: required keys present, no unknown keys.
-- Unknown keys come first (a misspelt dimm is the reason dim is missing),
-- with the closest valid name; every error points at the user's line.
function models.check_config(name, cfg, required, optional)
  local level = options.user_level()
  if type(cfg) ~= 'table' then error(('models.%s: expected a config table, got %s'):format(name, type(cfg)), level) end
  local known = {}
  for _, k in ipairs(required) do known[k] = true end
  for _, k in ipairs(optional) do known[k] = true end
  local k, listed, names = options.unknown(cfg, known)
  if k then
    error(("models.%s: unknown config key '%s'%s (expected %s)"):format(name, k, options.did_you_mean(k, names), listed), level)
  end
  for _, k in ipairs(required) do
    if cfg[k] == nil then error(('models.%s: config needs %s'):format(name, k), level) end
  end
end

-- The keys each architecture's config takes (models.build picks these out of a flat settings table).
models.config_keys = {
  gpt = {'vocab', 'dim', 'heads', 'layers', 'seq', 'ffn', 'residual', 'norm', 'activation'},
  vibenet = {'vocab', 'dim', 'layers', 'seq', 'block', 'streams', 'constraint'},
  funnel = {'vocab', 'seq', 'widths', 'attentions'},
  stateful = {'vocab', 'dim', 'heads', 'layers', 'seq', 'ffn', 'norm', 'activation', 'residual'},
}

local function numbers(v)
  if type(v) ~= 'string' then return v end
  local out = {}
  for n in v:gmatch('%d+') do out[#out + 1] = tonumber(n) end
  return out
end

-- models.build(name, settings) -> model: the architecture `name` (gpt,
-- vibenet, funnel or stateful) from a flat settings table such as a script's
-- config; each takes the keys it knows (models.config_keys) and ignores the
-- rest. The funnel's widths and attentions may be lists or strings ('256,128,64');
-- by default they follow dim and layers: widths {4 dim, 2 dim, dim}, attentions {2, 2, layers}.
function models.build(name, settings)
  local keys = models.config_keys[name]
  if not keys then
    local names = {}
    for n in pairs(models.config_keys) do names[#names + 1] = n end
    table.sort(names)
    error(("models.build: unknown model '%s' (expected %s)"):format(tostring(name), table.concat(names, ', ')), 2)
  end
  local cfg = {}
  for _, k in ipairs(keys) do
    local v = settings[k]
    if v ~= nil and v ~= '' then cfg[k] = v end
  end
  if name == 'funnel' then
    cfg.widths = numbers(cfg.widths) or (settings.dim and {4 * settings.dim, 2 * settings.dim, settings.dim})
    cfg.attentions = numbers(cfg.attentions) or (settings.layers and {2, 2, settings.layers})
  end
  return models[name](cfg)
end

-- m:save_pretrained(folder): a model from models.from_pretrained written back
-- in Hugging Face's layout (config.json, model.safetensors, its tokenizer
-- files), loadable by transformers (added to nn.Module here: models stands
-- above nn)
function nn.Module:save_pretrained(folder)
  local path = pretrained.save(self, folder)
  return path
end

return models
