-- train.fit's checkpoints: the model, the optimizer's state, the random
-- generators' states (the CPU's and the device's) and the step in one safetensors file, written
-- atomically, with the run's settings in its metadata.
local torch = require('anatomy.torch')
local nn = require('anatomy.nn')
local checkpoint = {}

-- checkpoint.rng_states(device) -> {rng = the CPU generator's state,
-- rng_device = the device's own generator's (absent on the CPU)}: a run on a
-- GPU draws there (dropout, shuffles) from its generator, not the CPU's, and
-- resumes exactly only with both.
function checkpoint.rng_states(device)
  local t = {rng = torch.get_rng_state()}
  if device ~= 'cpu' then t.rng_device = torch.get_rng_state(device) end
  return t
end

-- checkpoint.restore_rng(t, device): what rng_states saved into t
function checkpoint.restore_rng(t, device)
  torch.set_rng_state(t.rng)
  if t.rng_device and device ~= 'cpu' then torch.set_rng_state(t.rng_device, device) end
end

-- train.save_checkpoint(path, model, opt, step, metadata): model, optimizer
-- state, RNG state and step in one safetensors file, written atomically.
function checkpoint.save(path, model, opt, step, metadata)
  local tensors = {}
  for name, p in model:named_parameters() do tensors['model.' .. name] = p:detach() end
  for name, t in pairs(opt:state_tensors('optim.')) do tensors[name] = t end
  for k, v in pairs(checkpoint.rng_states(model:device())) do tensors[k] = v end
  local meta = {format = 'anatomy-checkpoint', step = tostring(step), class = nn.typename(model)}
  for k, v in pairs(metadata or {}) do meta[k] = tostring(v) end
  torch.save_safetensors(path, tensors, meta)
end

-- checkpoint.at_step(path, step) -> the name a kept checkpoint of that step
-- has beside path: run.safetensors -> run.step100.safetensors
function checkpoint.at_step(path, step)
  local stem = path:match('^(.*)%.safetensors$')
  return stem and ('%s.step%d.safetensors'):format(stem, step) or ('%s.step%d'):format(path, step)
end

-- checkpoint.read(path) -> the file's tensors, its metadata and the model's
-- state dict (the tensors named model.*, without the prefix); an error when
-- the file is not an anatomy checkpoint
function checkpoint.read(path)
  local t, meta = torch.load_safetensors(path)
  if meta.format ~= 'anatomy-checkpoint' then error(("'%s' is not an anatomy checkpoint"):format(path), 2) end
  local sd = {}
  for name, v in pairs(t) do
    local n = name:match('^model%.(.*)$')
    if n then sd[n] = v end
  end
  return t, meta, sd
end

-- train.load_checkpoint(path, model, opt) -> step, metadata
function checkpoint.load(path, model, opt)
  local t, meta, sd = checkpoint.read(path)
  model:load_state_dict(sd)
  if opt then opt:load_state_tensors(t, 'optim.') end
  checkpoint.restore_rng(t, model:device())
  return tonumber(meta.step), meta
end

return checkpoint
