-- help(x): the documentation of anything in the session, read from the `--`
-- comment lines above each definition in the library's own source (so it
-- never drifts from the code). Functions written in C (tensor methods and the
-- rest of the LibTorch operations) are named with PyTorch's documentation to
-- read, since their arguments are PyTorch's.
local torch = require('anatomy.torch')
local nn = require('anatomy.nn')
local help = {}

local lines_cache = {}
local function source_lines(path)
  if lines_cache[path] == nil then
    local f = io.open(path, 'rb')
    local lines = false
    if f then
      lines = {}
      for line in f:lines() do lines[#lines + 1] = line end
      f:close()
    end
    lines_cache[path] = lines
  end
  return lines_cache[path] or nil
end

-- The comment block right above line n of a file, without the dashes.
local function comment_above(path, n)
  local lines = source_lines(path)
  if not lines then return nil end
  local out = {}
  local i = n - 1
  while i >= 1 and lines[i]:match('^%s*%-%-') do
    table.insert(out, 1, (lines[i]:gsub('^%s*%-%-+ ?', '')))
    i = i - 1
  end
  return #out > 0 and table.concat(out, '\n') or nil
end

-- The comment block at the top of a file (what the file is).
local function file_header(path)
  local lines = source_lines(path)
  if not lines then return nil end
  local out = {}
  for _, line in ipairs(lines) do
    local text = line:match('^%-%- ?(.*)$')
    if not text then break end
    out[#out + 1] = text
  end
  return #out > 0 and table.concat(out, '\n') or nil
end

local function lua_source(f)
  local info = debug.getinfo(f, 'S')
  if info.what == 'C' then return nil end
  local path = info.source:match('^@(.*)$')
  return path, info.linedefined
end

-- C functions whose Lua form differs from PyTorch's (a function argument
-- where Python has a `with` block).
local own_signatures = {
  no_grad = 'torch.no_grad(fn, ...) -> fn(...): runs fn without recording gradients (PyTorch\'s `with torch.no_grad():`)',
  enable_grad = 'torch.enable_grad(fn, ...) -> fn(...): runs fn with gradients recorded, inside a no_grad',
  autocast = 'torch.autocast(device_type, dtype, fn, ...) -> fn(...): runs fn under autocast on \'cpu\', \'cuda\' or \'accel\' '
    .. '(dtype \'bfloat16\' or \'float16\'; nil: bfloat16 on cpu, float16 on cuda and accel), as PyTorch\'s `with torch.autocast(...)`; '
    .. 'the previous state comes back afterwards, also after an error',
  safe_open = 'torch.safe_open(path) -> f: a safetensors file\'s header read and checked, its tensors read one at a time: '
    .. 'f:keys(), f:get_tensor(name), f:shape(name), f:dtype(name), f:metadata(), f:read_into(name, t) (straight into a '
    .. 'tensor of the same dtype and shape; false when it does not fit). As safetensors\' safe_open',
  ['cuda.CUDAGraph'] = 'torch.cuda.CUDAGraph() -> g: g:capture_begin(), the work to record, g:capture_end(), then g:replay() '
    .. 'reruns it on the same memory (copy new input into the captured tensors first); g:reset() drops it. Needs a GPU',
  ['cuda.side_stream'] = 'torch.cuda.side_stream(fn, ...) -> fn(...): runs fn with a side stream of LibTorch\'s pool as the '
    .. 'current stream (it waits for the work queued before; the previous stream waits for its work afterwards), as '
    .. 'PyTorch\'s `with torch.cuda.stream(torch.cuda.Stream()):`; a CUDA graph and the steps that warm it up run there. Needs a GPU',
  ['profiler.count_ops'] = 'torch.profiler.count_ops(fn, ...) -> counts, fn(...): the operators LibTorch dispatched while fn ran '
    .. '(on every thread; counts.ops, counts.by_name) and the host synchronisations among them (counts.syncs, '
    .. 'counts.syncs_by_name: item and other reads of a device tensor to the host, copies to the CPU, blocking copies from it, nonzero, '
    .. 'masked_select, unique), as PyTorch\'s torch.profiler lists the "aten::" events',
}

-- help.doc(f) -> the documentation of a function (nil when it has none)
function help.doc(f)
  if type(f) ~= 'function' then return nil end
  local path, line = lua_source(f)
  if path then return comment_above(path, line) end
  local names = debug.getregistry()['anatomy.names'] or {}
  local name = names[f]
  if name and own_signatures[name] then return own_signatures[name] end
  if name then
    return ('%s: a LibTorch operation with PyTorch\'s arguments (see torch.%s in PyTorch\'s documentation); '
      .. 'dims and indices count from 1, options go in a trailing table'):format(name, name:gsub('^nn%.', 'nn.'))
  end
  return nil
end

local function first_line(s) return s and s:match('[^\n]*') or '' end

-- Whether f is a method (its first parameter is self) or a C function.
local function is_method(f)
  if debug.getinfo(f, 'S').what == 'C' then return true end
  return debug.getlocal(f, 1) == 'self'
end

-- The members of a table or class that are functions, sorted, each with its
-- one-line doc; of a class, its methods only.
local function member_lines(t, seen_prefix, methods_only)
  local names = {}
  local visited = {}
  local level = t
  while type(level) == 'table' and not visited[level] do
    visited[level] = true
    for k, v in pairs(level) do
      if type(k) == 'string' and not k:match('^_') and type(v) == 'function' and not names[k]
        and (not methods_only or is_method(v)) then names[k] = v end
    end
    local mt = getmetatable(level)
    level = mt and type(mt.__index) == 'table' and mt.__index or nil
  end
  local keys = {}
  for k in pairs(names) do keys[#keys + 1] = k end
  table.sort(keys)
  local out = {}
  for _, k in ipairs(keys) do
    local doc = first_line(help.doc(names[k]))
    out[#out + 1] = ('  %-24s %s'):format((seen_prefix or '') .. k, doc)
  end
  return out
end

-- Resolves 'train.fit' or 'nn.Linear' to the value it names.
local function resolve(name)
  local v = _G
  for part in name:gmatch('[^.:]+') do
    if type(v) ~= 'table' then return nil end
    v = v[part]
  end
  return v
end

local start = [[
anatomy: LuaJIT over LibTorch. Globals, each with help(name):
  torch       tensors and autograd, PyTorch's names, 1-based dims and indices (help(torch.Tensor));
              torch.cuda (is_available, synchronize, memory counters, side_stream, CUDAGraph), torch.autocast,
              torch.profiler.count_ops; devices cpu, cuda, accel (a test device in CPU memory) and meta
  nn          modules: nn.Linear, nn.Sequential, nn.block, ... (help(nn.Module): the model protocol)
  models      the seed architectures: models.gpt, models.vibenet, models.funnel, models.stateful, models.build;
              models.from_pretrained('EleutherAI/pythia-70m') (a folder, or a Hub name at a revision)
  hub         the Hugging Face Hub, into huggingface_hub's cache: hub.open, hub.hf_hub_download, hub.list_repo_refs
  data        corpora and tokenizers: data.text, data.default_text
  train       train.fit, train.evaluate, checkpoints
  dist        data-parallel training across processes (anatomy --nproc N): dist.all_reduce, ...
  optim       optim.AdamW, optim.Adam, optim.SGD, optim.lr_scheduler
  probe       probe.capture, probe.replace, probe.skip: hook points on every module (TransformerLens's names too);
              probe.run_with_cache, probe.run_with_hooks, probe.with (hooks removed on return), probe.list;
              probe.ablate, probe.patch, probe.logit_attribution, probe.test_prompt;
              probe.linear (a probe per layer), probe.detect_heads (previous-token, induction heads)
  patching    patching.run (activation patching), patching.path (path patching), patching.attribute
              (attribution patching: atp, atp with the QK fix, ig), patching.edges (edge attribution), patching.logit_diff
  steer       steering vectors: steer.vector (from contrasting texts), steer.apply (added while the model runs)
  lens        what each layer predicts: lens.logit, lens.tuned (trained translators), l:trajectory, l:table
  weights     what a head does from its weights: weights.ov, weights.qk (factored), f:tokens, weights.composition
  sae         sparse autoencoders and transcoders: sae.train, sae.evaluate, sae.attach, sae.load, sae.top_activations
  autopsy     autopsy.run: the per-layer table, JSON and HTML report; autopsy.series: across checkpoints
  experiment  claims against measurements, the data rule, sweeps
  provenance  the record every result carries
  exact       a tiny transformer in exact arithmetic
  text        measures of generated text: text.compressed_size, text.compression_ratio
help(x) for a function, class, model or table; help('train.fit') by name.]]

-- help.text(x) -> the help of x as a string (help(x) prints it)
function help.text(x)
  if x == nil then return start end
  if type(x) == 'string' then
    local v = resolve(x)
    if v == nil then return ("help: nothing is called '%s' (help() lists where to start)"):format(x) end
    return help.text(v)
  end
  if type(x) == 'function' then
    return help.doc(x) or 'a function without documentation'
  end
  if torch.is_tensor(x) then
    return tostring(x):match('[^\n]*') .. '\n\n' .. help.text(torch.Tensor)
  end
  if type(x) == 'table' then
    local out = {}
    local is_instance = nn.is_module(x) and getmetatable(x) ~= nil
    local cls = is_instance and getmetatable(x) or x
    local name = rawget(cls, '__typename')
    if name then
      -- the class's own file: nn.Linear in nn/Linear.lua, else where its __init or forward is
      local dir = debug.getregistry()['anatomy.lua_dir']
      local ns, short = name:match('^(%w+)%.(%w+)$')
      local path = dir and ns and (dir .. '/anatomy/' .. ns .. '/' .. short .. '.lua')
      if not (path and source_lines(path)) then
        local init = rawget(cls, 'forward') or rawget(cls, '__init')
        path = init and lua_source(init)
      end
      local header = path and file_header(path)
      out[#out + 1] = name .. (header and ('\n' .. header) or '')
      if is_instance then out[#out + 1] = '\n' .. tostring(x) end
      out[#out + 1] = '\nmethods:'
    elseif x == torch.Tensor then
      out[#out + 1] = 'torch.Tensor: methods with PyTorch\'s names and arguments; dims and indices count from 1.'
    elseif type(getmetatable(x)) == 'table' then
      -- an object of a library class (a cache, a run, an autopsy, a result): what it is, then its methods
      local mt = getmetatable(x)
      local methods = rawget(mt, 'methods') or (type(rawget(mt, '__index')) == 'table' and rawget(mt, '__index')) or mt
      local path
      for _, v in pairs(methods) do
        if type(v) == 'function' then path = lua_source(v) if path then break end end
      end
      local header = path and file_header(path)
      out[#out + 1] = (rawget(mt, '__typename') or 'an object') .. (header and ('\n' .. header) or '')
      local ok, text = pcall(tostring, x)
      if ok and type(text) == 'string' and not text:match('^table: ') then out[#out + 1] = '\n' .. text:sub(1, 2000) end
      out[#out + 1] = '\nmethods:'
      for _, line in ipairs(member_lines(methods, nil, false)) do out[#out + 1] = line end
      return table.concat(out, '\n')
    end
    for _, line in ipairs(member_lines(x, nil, name ~= nil)) do out[#out + 1] = line end
    local tables = {}
    for k, v in pairs(x) do
      if type(k) == 'string' and not k:match('^_') and type(v) == 'table' and not name then tables[#tables + 1] = k end
    end
    table.sort(tables)
    if #tables > 0 then out[#out + 1] = 'tables: ' .. table.concat(tables, ', ') end
    return table.concat(out, '\n')
  end
  return ('%s: %s'):format(type(x), tostring(x))
end

-- The globals help() names, in its order.
local function global_names()
  local names = {}
  for name in start:gmatch('\n  (%w+) ') do names[#names + 1] = name end
  return names
end

-- The functions a table holds itself (not through a metatable) that are
-- written in Lua, sorted: {{name, f}, ...}.
local function own_functions(t)
  local out = {}
  for k, v in pairs(t) do
    if type(k) == 'string' and not k:match('^_') and type(v) == 'function' and lua_source(v) then out[#out + 1] = {k, v} end
  end
  table.sort(out, function(a, b) return a[1] < b[1] end)
  return out
end

-- help.reference() -> the reference as Markdown: every global help() names,
-- its description there, and each function written in Lua that it and its
-- tables hold, with the documentation help(f) prints. docs/reference.md is
-- this text (scripts/reference.lua writes it; a test checks they agree).
function help.reference()
  local out = {'# Reference', '',
    'Generated from the library\'s own documentation comments by `anatomy scripts/reference.lua`',
    '(what `help(x)` prints in a session); a test fails when this file and `help` disagree.',
    'Functions written in C (tensor operations, LibTorch\'s) take PyTorch\'s arguments: `help(torch.Tensor)`.', ''}
  local descriptions = {}
  for line in start:gmatch('[^\n]+') do
    local name, text = line:match('^  (%w+)%s+(.*)$')
    if name then descriptions[#descriptions + 1] = {name, text} end
  end
  local function section(title, t)
    local fns = own_functions(t)
    if #fns == 0 then return end
    out[#out + 1] = '### ' .. title
    out[#out + 1] = ''
    for _, f in ipairs(fns) do
      out[#out + 1] = ('- `%s.%s`: %s'):format(title, f[1], ((help.doc(f[2]) or 'undocumented'):gsub('\n', ' ')))
    end
    out[#out + 1] = ''
  end
  local globals = {}  -- a global's table under another (torch.nn is nn) has its own section
  for _, name in ipairs(global_names()) do globals[_G[name]] = true end
  for _, name in ipairs(global_names()) do
    local g = _G[name]
    out[#out + 1] = '## ' .. name
    out[#out + 1] = ''
    for _, d in ipairs(descriptions) do if d[1] == name then out[#out + 1] = d[2] .. '' end end
    out[#out + 1] = ''
    section(name, g)
    local keys = {}
    for k, v in pairs(g) do
      if type(k) == 'string' and not k:match('^_') and type(v) == 'table' and not globals[v] then keys[#keys + 1] = k end
    end
    table.sort(keys)
    for _, k in ipairs(keys) do section(name .. '.' .. k, g[k]) end
  end
  return table.concat(out, '\n')
end

-- help(x): prints the documentation of x (a function, class, model, table,
-- tensor, or a name such as 'train.fit'); help() prints where to start.
function help.help(x)
  print(help.text(x))
end

return help
