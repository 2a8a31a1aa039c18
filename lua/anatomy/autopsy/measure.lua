-- The autopsy's measurements of one forward and backward: the layers of a
-- model, every layer's input and output recorded (dissect), and the
-- per-step snapshot that training's probe steps and autopsy.step share
-- (gradient norms in one fused pass, activation statistics, attention).
local torch = require('anatomy.torch')
local probe = require('anatomy.probe')
local inputs = require('anatomy.probe.inputs')
local nn = require('anatomy.nn')
local measure = {}

-- Every measure autopsy.run takes (its opts.metrics picks some): the
-- registry's metric names (measures.lua).
measure.all_metrics = require('anatomy.autopsy.measures').metrics()

function measure.layers(model)
  local layers, why = model:layers()
  if not layers then error('autopsy: ' .. why, 3) end
  return layers
end

function measure.l2(list)
  local s = 0
  for _, v in ipairs(list) do s = s + v * v end
  return math.sqrt(s)
end

function measure.median(values)
  local v = {}
  for i, x in ipairs(values) do v[i] = x end
  table.sort(v)
  if #v == 0 then return 0 end
  return #v % 2 == 1 and v[(#v + 1) / 2] or (v[#v / 2] + v[#v / 2 + 1]) / 2
end

function measure.starts_with(s, prefix) return s:sub(1, #prefix) == prefix end

-- One forward and backward with every layer's input and output recorded.
-- measure.residual_branch(block) -> the name of the child that computes f in
-- a residual wrapper whose skip path is not the identity (nn.Gate's gate(x),
-- nn.HyperConnections' H_res x), or nil. A user's wrapper declares it the
-- same way: Wrapper.residual_branch = 'inner' (and, where a child replaces
-- the identity, Wrapper.skip_module = 'gate').
function measure.residual_branch(block)
  local b = block.residual_branch
  if type(b) ~= 'string' then return nil end
  local child = rawget(block, '_children') and block[b]
  if type(child) ~= 'table' then
    error(('%s declares residual_branch = %q, but it has no child of that name'):format(nn.typename(block), b), 0)
  end
  return b
end

-- measure.real_rows(t, idx) -> t (B, T, ...) at the positions idx (1-based
-- indices into B * T) lists: (N, ...); t itself without idx.
function measure.real_rows(t, idx)
  if idx == nil then return t end
  local size = t:size()
  local rest = {}
  for d = 3, #size do rest[#rest + 1] = size[d] end
  return t:reshape(size[1] * size[2], unpack(rest)):index_select(1, idx)
end

-- measure.padded_attention(pattern (B, H, T, T), mask (B, T)) -> the mean
-- entropy, its per-head means (H) and the diagonal mass, over the real
-- queries only (padded keys carry no weight already); the definitions of
-- torch.metrics.attention_entropy and diagonal_mass.
function measure.padded_attention(pattern, mask)
  local p = pattern:detach():float()
  local plogp = (p * p:log()):masked_fill(p:le(0), 0)
  local h = -plogp:double():sum(4)                       -- (B, H, T)
  local m = mask:double():unsqueeze(2)                   -- (B, 1, T)
  local n = mask:sum():item()
  local heads = (h * m):sum(3):sum(1) / n                -- (H)
  local eye = torch.eye(p:size(3), {dtype = 'float32', device = p.device})
  local diag = ((p * eye):sum(4):double() * m):sum():item() / (n * p:size(2))  -- each query's weight on itself
  return heads:mean():item(), heads, diag
end

function measure.dissect(model, layers, x, y, mask, idx)
  local io_ = {}
  local branch_out = {}
  local patterns
  -- the hooks below go when the forward and backward end, after an error too
  local logits, loss = probe.scope(model, function()
    for i, l in ipairs(layers) do
      probe.replace(model, l[1], function(out, _, input)
        io_[i] = {input = torch.is_tensor(input) and input:detach() or nil, output = out:detach(), branch = branch_out[i]}
      end)
      -- a residual wrapper whose skip path is not the identity (nn.Gate): f's own output too
      local branch = measure.residual_branch(l[2])
      if branch then
        probe.replace(model, l[1] .. '.' .. branch, function(out)
          if torch.is_tensor(out) then branch_out[i] = out:detach() end
        end)
      end
    end
    patterns = probe.attach_capture(model, {filter = {'*.pattern'}})
    model:zero_grad()
    local out = inputs.forward(model, x, mask, 'autopsy.run')
    -- padded: the real positions' predictions only (measure.real_rows), in the loss and everywhere after
    out = measure.real_rows(out, idx)
    local l = nn.functional.cross_entropy(out, measure.real_rows(y, idx))
    l:backward()
    return out, l
  end)
  return {loss = loss:item(), logits = logits:detach(), io = io_, patterns = patterns}
end

-- measure.step(model, fn) (autopsy.step) -> snapshot, fn's result: the autopsy's per-step
-- measurements from the forward and backward that fn() runs (a training
-- step's own: no extra pass). fn must run the model and call backward.
-- snapshot = {grad_norm = {param = ‖grad‖}, weight_erank = {param = erank of
-- every 2-D weight}, layers = {{name, act_mean, act_std, act_max, act_rms,
-- entropy, diag}, ...}}. Weight ranks from the eigenvalues of each weight's
-- Gram matrix (formed on the device, solved on the host at the read: a GPU's
-- eigensolver reads its status back once a call); gradient norms from one fused pass;
-- every number computed where the model is (torch.metrics.step_values) and
-- read back in one copy when a field of the snapshot is first looked at, not
-- in the step: on a device a read waits for it, and a training step that
-- queues its work without waiting keeps the device busy.
function measure.step(model, fn)
  local layers = measure.layers(model)
  local filter = {'*.pattern'}
  for _, l in ipairs(layers) do filter[#filter + 1] = l[1] end
  local capture, handle = probe.attach_capture(model, {filter = filter})
  local ok, result = pcall(fn)
  handle:remove()
  if not ok then error(result, 0) end
  local weights, weight_names, grads, grad_names = {}, {}, {}, {}
  for name, p in model:named_parameters() do
    if p:dim() == 2 then
      weights[#weights + 1] = p
      weight_names[#weights] = name
    end
    grad_names[#grad_names + 1] = name
    grads[#grad_names] = p.grad or false
  end
  -- each layer's output, and its attention pattern when it has one (false: none)
  local outputs, patterns = {}, {}
  for i, l in ipairs(layers) do
    outputs[i] = torch.is_tensor(capture[l[1]]) and capture[l[1]] or false
    patterns[i] = false
    for name, pattern in pairs(capture) do
      if name ~= 'grads' and name:find('%.pattern$') and measure.starts_with(name, l[1] .. '.') then
        patterns[i] = pattern
        break
      end
    end
  end
  local read = torch.metrics.step_values(weights, grads, outputs, patterns, false)
  -- the snapshot's fields, from the one read
  local function fill(snap)
    local v = read()
    snap.weight_erank, snap.grad_norm, snap.layers = {}, {}, {}
    for i = 1, #weights do snap.weight_erank[weight_names[i]] = v.eranks[i] end
    for i = 1, #grad_names do
      local n = v.norms[i]
      if n == n then snap.grad_norm[grad_names[i]] = n end
    end
    for i, l in ipairs(layers) do
      local row, s = {name = l[1]}, v.stats[i]
      if outputs[i] then row.act_mean, row.act_std, row.act_max, row.act_rms = s.mean, s.std, s.max_abs, s.rms end
      if patterns[i] then row.entropy, row.diag = v.entropy[i], v.diag[i] end
      snap.layers[i] = row
    end
  end
  local snap = setmetatable({}, {__index = function(t, key)
    setmetatable(t, nil)
    fill(t)
    return rawget(t, key)
  end})
  return snap, result
end


-- What a training step with probes keeps (train/probe_record.lua, below
-- the autopsy so that train.fit records it without requiring upwards).
local record = require('anatomy.train.probe_record')
measure.grad_norms = record.grad_norms
measure.stds = record.stds
measure.probe_record = record.probe_record

return measure
