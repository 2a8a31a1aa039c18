-- train.fit's options: the one list of them, each with its default (nil:
-- none, or computed from the model where said), what it must be, and what
-- it does. The check below runs when train.fit is called, so that a string
-- lr is train.fit's error, not optim.AdamW's argument #3 later.
-- print(train.options) lists them.
local torch = require('anatomy.torch')
local options = require('anatomy.torch.options')
local nn = require('anatomy.nn')

-- {key, default, kind, what it does}; kind: 'count' (a positive integer),
-- 'whole' (a non-negative integer), 'integer', 'positive', 'nonnegative',
-- a Lua type, a list of the allowed strings, or nil (checked below).
local settings = {
  -- how long, and on what
  {'steps', 1000, 'count', 'optimizer steps'},
  {'batch', 32, 'count', 'sequences per step (per rank in a data-parallel run)'},
  {'seq', nil, 'count', "tokens per sequence (default: the model's context, else 64)"},
  {'seconds', nil, 'positive', 'a time budget: stop after the first step that ends past it (and checkpoint there)'},
  {'seed', nil, 'integer', 'torch.manual_seed before anything else'},
  -- the optimizer (AdamW) and its schedule
  {'lr', 3e-3, 'positive', 'peak learning rate'},
  {'weight_decay', 0.1, 'nonnegative', 'AdamW weight decay'},
  {'betas', {0.9, 0.95}, nil, "AdamW's two decay rates, each in [0, 1)"},
  {'decay', 'matrices', {'matrices', 'all'}, 'which parameters weight decay applies to'},
  {'warmup', 0, 'whole', 'steps of linear warm-up'},
  {'schedule', 'cosine', {'cosine', 'constant'}, 'the learning rate after warm-up'},
  {'clip', 1.0, 'nonnegative', 'gradient norm clipping (0: none)'},
  -- evaluation and output
  {'eval_every', nil, 'count', 'steps between evaluations (default: a tenth of the run)'},
  {'eval_batches', 8, 'count', 'validation batches an evaluation reads'},
  {'log_every', nil, 'count', 'steps between progress lines off a terminal (default: a fiftieth of the run)'},
  {'log', nil, nil, 'a JSON-lines file: one line a step'},
  {'quiet', nil, 'boolean', 'print nothing'},
  {'on_step', nil, 'function', 'on_step(step, info) after each step (info: loss, lr, grad_norm, val_loss, tokens_per_second)'},
  -- checkpoints
  {'checkpoint', nil, nil, 'a file: the model, optimizer and generator state, written atomically'},
  {'checkpoint_every', nil, nil, 'steps between checkpoints (default: at the end only)'},
  {'keep_checkpoints', nil, 'boolean', 'also keep each checkpoint as <checkpoint>.step<N>.safetensors (autopsy.series reads the folder)'},
  {'resume', true, 'boolean', 'continue from the checkpoint when it exists'},
  -- what the run measures and how it computes
  {'probe', nil, 'table', '{every = 50, filter, grad, fn(step, capture, record)}: captures during that step\'s own pass'},
  {'recurrence', nil, 'count', 'k extra passes of a stateful model, fed its previous pass\'s hidden states'},
  {'dtype', nil, nil, "'float32' (default), or 'bf16' (or 'bfloat16'): the forward under autocast, float32 master weights"},
  {'cuda_graph', nil, nil, 'on a GPU: one whole step recorded after two warm-up steps and replayed'},
  {'sync', nil, 'boolean', "off the CPU: read each step's loss before its optimizer step, not one step late (the device waits; a non-finite loss is traced to its module)"},
  {'bucket_mb', nil, nil, 'data-parallel: the size of a gradient bucket in MiB (default 25)'},
  {'_gpu_paths', nil, nil, "tests only: the GPU's bookkeeping (one-step-late reads, trusted ids) on any device"},
}

local config = {}
local defaults, kinds, known = {}, {}, {}
for _, s in ipairs(settings) do
  known[#known + 1] = s[1]
  defaults[s[1]], kinds[s[1]] = s[2], s[3]
end

-- train.fit's dtype: what the forward pass computes in. Parameters, gradients
-- and the optimizer's state stay float32 (master weights) in every case.
local compute_dtypes = {float32 = 'float32', float = 'float32', fp32 = 'float32', bf16 = 'bfloat16', bfloat16 = 'bfloat16'}

local function check_kind(key, v)
  local kind = kinds[key]
  if v == nil or kind == nil then return end
  local finite = type(v) == 'number' and v == v and v > -math.huge and v < math.huge
  local ok, want
  if kind == 'count' then ok, want = finite and v >= 1 and v % 1 == 0, 'a positive integer'
  elseif kind == 'whole' then ok, want = finite and v >= 0 and v % 1 == 0, 'a non-negative integer'
  elseif kind == 'integer' then ok, want = finite and v % 1 == 0, 'an integer'
  elseif kind == 'positive' then ok, want = finite and v > 0, 'a positive number'
  elseif kind == 'nonnegative' then ok, want = finite and v >= 0, 'a non-negative number'
  elseif type(kind) == 'table' then
    ok = false
    for _, k in ipairs(kind) do ok = ok or v == k end
    want = "'" .. table.concat(kind, "' or '") .. "'"
  else ok, want = type(v) == kind, 'a ' .. kind end
  if not ok then
    local got = type(v) == 'string' and ("the string '%s'"):format(v) or (type(v) == 'number' and tostring(v) or type(v))
    error(('train.fit: option %s must be %s, got %s'):format(key, want, got), options.user_level() + 1)
  end
end

-- The settings the kinds above cannot say, each an error at train.fit's caller.
local function check_rest(o, world_size, model)
  if o.recurrence and not model.step then
    error(('train.fit: recurrence needs a stateful model (models.stateful), got %s'):format(nn.typename(model)), 4)
  end
  if o.betas ~= nil then
    local b = o.betas
    if type(b) ~= 'table' or #b ~= 2 or type(b[1]) ~= 'number' or type(b[2]) ~= 'number' or not (b[1] >= 0 and b[1] < 1 and b[2] >= 0 and b[2] < 1) then
      local shown = {}
      for i, x in ipairs(type(b) == 'table' and b or {}) do shown[i] = tostring(x) end
      error(('train.fit: option betas must be two numbers in [0, 1), got %s'):format(type(b) == 'table' and
        ('{' .. table.concat(shown, ', ') .. '}') or type(b)), 4)
    end
  end
  for _, key in ipairs{'checkpoint', 'log'} do
    if o[key] ~= nil and (type(o[key]) ~= 'string' or o[key] == '') then
      error(('train.fit: %s must be a file path (a non-empty string), got %s'):format(key,
        type(o[key]) == 'string' and 'an empty string' or type(o[key])), 4)
    end
  end
  if o.checkpoint_every ~= nil and not (type(o.checkpoint_every) == 'number' and o.checkpoint_every >= 1 and o.checkpoint_every % 1 == 0) then
    error(('train.fit: checkpoint_every must be a positive integer, got %s'):format(tostring(o.checkpoint_every)), 4)
  end
  if o.probe ~= nil then  -- every = 0 captured at step 1 alone (step % 0 is nan), silently
    options.check(o.probe, {'every', 'filter', 'grad', 'fn'}, 'train.fit: probe', 4)
    options.whole(o.probe.every, 'probe.every', 'train.fit', nil, 1, 5)
  end
  if o.keep_checkpoints and not o.checkpoint then
    error('train.fit: keep_checkpoints needs checkpoint (the file whose copies it keeps)', 4)
  end
  local dtype = o.dtype or 'float32'
  if dtype == 'float16' or dtype == 'fp16' or dtype == 'half' then
    error(("train.fit: dtype '%s' needs loss scaling, which train.fit does not do; use dtype = 'bf16' (same range as float32)"):format(dtype), 4)
  end
  o.compute_dtype = compute_dtypes[dtype]
  if not o.compute_dtype then
    error(("train.fit: unknown dtype '%s', expected 'float32' or 'bf16' (also spelt 'bfloat16')"):format(tostring(dtype)), 4)
  end
  if o.cuda_graph ~= nil and type(o.cuda_graph) ~= 'boolean' then
    error(('train.fit: cuda_graph must be a boolean, got %s'):format(type(o.cuda_graph)), 4)
  end
  if o.cuda_graph then
    if not torch.cuda.is_available() then
      error('train.fit: cuda_graph = true needs a GPU: ' .. (torch.version.cuda
        and ('this LibTorch has CUDA ' .. torch.version.cuda .. ', but no GPU is visible')
        or ('this anatomy is built against LibTorch ' .. torch.__version__ .. ' without CUDA (scripts/setup --torch=cuda builds the CUDA one)')), 4)
    end
    if not model:device():match('^cuda') then
      error(("train.fit: cuda_graph = true needs the model on the GPU, but its parameters are on '%s' (--device=cuda, or model:to('cuda'))"):format(model:device()), 4)
    end
    if o.recurrence then error('train.fit: cuda_graph = true cannot record recurrence (each pass depends on the last)', 4) end
    if world_size > 1 then error('train.fit: cuda_graph = true cannot record the all-reduce of a data-parallel run', 4) end
  end
  if o.bucket_mb ~= nil and not (type(o.bucket_mb) == 'number' and o.bucket_mb > 0) then
    error(('train.fit: bucket_mb must be a positive number of MiB, got %s'):format(tostring(o.bucket_mb)), 4)
  end
end

-- config.resolve(opts, model, world_size) -> the run's settings: opts
-- checked (unknown keys, kinds, the rest), over the defaults, with the
-- defaults that depend on the model and the run's length filled in. Errors
-- are at the caller of train.fit.
function config.resolve(opts, model, world_size)
  opts = options.check(opts, known, 'train.fit', 3)
  for k, v in pairs(opts) do check_kind(k, v) end
  local o = {}
  for k, v in pairs(defaults) do o[k] = v end
  for k, v in pairs(opts) do o[k] = v end
  o.seq = o.seq or model:context() or 64
  o.eval_every = o.eval_every or math.max(1, math.floor(o.steps / 10))
  o.log_every = o.log_every or math.max(1, math.floor(o.steps / 50))
  check_rest(o, world_size, model)
  return o
end

-- print(train.options): every option of train.fit with its default and what it does
config.listing = setmetatable({}, {
  __index = function(_, key) return defaults[key] end,
  __tostring = function()
    local lines = {'train.fit options (default, what it does):'}
    for _, s in ipairs(settings) do
      if s[1]:sub(1, 1) ~= '_' then
        local d = s[2]
        local shown = d == nil and '-' or type(d) == 'table' and '{' .. table.concat(d, ', ') .. '}'
          or type(d) == 'string' and ("'" .. d .. "'") or tostring(d)
        lines[#lines + 1] = ('  %-17s %-12s %s'):format(s[1], shown, s[4])
      end
    end
    return table.concat(lines, '\n')
  end,
})

return config
