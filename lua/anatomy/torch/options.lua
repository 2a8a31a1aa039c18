-- options: checks an options table against the keys a function accepts, so
-- that a misspelt option is an error that lists the right ones.
local options = {}

-- options.unknown(t, allowed) -> the first key of t (in sorted order) that
-- allowed does not name, and the allowed names, sorted, as a string
-- ('a, b, c'); nil when every key is allowed. allowed: a list of names or a
-- set {name = true}; names starting with _ are internal and not listed.
-- Every "unknown option / key" error is made from it.
function options.unknown(t, allowed)
  local set = allowed
  if allowed[1] then
    set = {}
    for _, k in ipairs(allowed) do set[k] = true end
  end
  local bad = {}
  for k in pairs(t) do if not set[k] then bad[#bad + 1] = tostring(k) end end
  if #bad == 0 then return nil end
  table.sort(bad)
  local names = {}
  for n in pairs(set) do
    if not tostring(n):match('^_') then names[#names + 1] = n end  -- _names are internal (tests)
  end
  table.sort(names)
  return bad[1], table.concat(names, ', '), names
end

-- options.check(opts, allowed, where, level) -> opts (or {} for nil)
-- allowed: a list of names, or a set {name = true}; level: error()'s level.
function options.check(opts, allowed, where, level)
  level = (level or 2) + 1
  if opts == nil then return {} end
  if type(opts) ~= 'table' then error(('%s: options must be a table, got %s'):format(where, type(opts)), level) end
  local k, names, list = options.unknown(opts, allowed)
  if k then error(("%s: unknown option '%s'%s (expected %s)"):format(where, k, options.did_you_mean(k, list), names), level) end
  return opts
end

-- The names other libraries give to what anatomy calls otherwise (PyTorch's
-- and nanoGPT's, Hugging Face's config keys): suggested when one of them is
-- an unknown key and anatomy's name is allowed there.
options.aliases = {learning_rate = 'lr', lr_rate = 'lr', n_layer = 'layers', n_layers = 'layers', num_layers = 'layers',
  num_hidden_layers = 'layers', n_head = 'heads', num_heads = 'heads', num_attention_heads = 'heads', n_embd = 'dim',
  d_model = 'dim', hidden_size = 'dim', block_size = 'seq', n_ctx = 'seq', max_position_embeddings = 'seq',
  vocab_size = 'vocab', d_mlp = 'ffn', intermediate_size = 'ffn', max_steps = 'steps', max_iters = 'steps',
  num_steps = 'steps', torch_dtype = 'dtype', batch = 'batch_size', random_seed = 'seed'}

-- options.did_you_mean(key, names) -> " (did you mean 'x'?)" naming the allowed
-- name nearest to key, or the one an alias names; '' when there is none.
function options.did_you_mean(key, names)
  local alias = options.aliases[key]
  if alias then
    for _, n in ipairs(names) do if n == alias then return (", did you mean '%s'?"):format(alias) end end
  end
  local near = options.closest(key, names)
  return near and (", did you mean '%s'?"):format(near) or ''
end

-- options.whole(v, name, where, default, low, level) -> v, or default when
-- v is nil: a whole number >= low (1 unless given), else an error naming
-- where and name at `level` (default 3: whoever called the function that
-- called this).
function options.whole(v, name, where, default, low, level)
  if v == nil then return default end
  low = low or 1
  if type(v) ~= 'number' or v ~= v or v % 1 ~= 0 or v < low then
    error(('%s: %s must be a whole number >= %d, got %s'):format(where, name, low, tostring(v)), level or 3)
  end
  return v
end

-- options.closest(name, names) -> the entry of names nearest to name (edit
-- distance, at most a third of its length away), or nil: the 'did you mean'
-- of an unknown key.
function options.closest(name, names)
  name = tostring(name)
  local best, best_d
  for _, n in ipairs(names) do
    local a, b = name, tostring(n)
    local prev = {}
    for j = 0, #b do prev[j] = j end
    for i = 1, #a do
      local cur = {[0] = i}
      for j = 1, #b do
        local cost = a:sub(i, i) == b:sub(j, j) and 0 or 1
        cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
      end
      prev = cur
    end
    if not best_d or prev[#b] < best_d then best, best_d = n, prev[#b] end
  end
  if best_d and best_d <= math.max(1, math.floor(#name / 3)) then return best end
  return nil
end

-- options.user_level() -> the level, for error() called in the function that
-- calls this, of the innermost caller outside the library: the line of the
-- user's script that made the call, however deep inside anatomy the check is.
function options.user_level()
  local library = debug.getregistry()['anatomy.lua_dir']
  for level = 2, 40 do
    local info = debug.getinfo(level + 1, 'S')
    if not info then break end
    local inside = info.what == 'C' or (library and info.source:sub(2, #library + 1) == library)
    if not inside then return level end
  end
  return 2
end

return options
