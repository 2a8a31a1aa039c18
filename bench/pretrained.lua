-- The anatomy side of the pretrained-checkpoint benchmark (bench/pretrained.py):
-- load a Hugging Face folder, time the load, forward passes and one autopsy.
--   anatomy bench/pretrained.lua FOLDER OUT.json MODE [B T REPEATS]
-- MODE: load (the load alone, for the peak-memory reading), forward, autopsy.
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')
local native = require('anatomy.torch.native')
local folder, out, mode = arg[1], arg[2], arg[3]
local B, T, repeats = tonumber(arg[4] or 8), tonumber(arg[5] or 256), tonumber(arg[6] or 3)
local result = {mode = mode, threads = torch.get_num_threads(), libtorch = torch.__version__}
local t0 = native.now()
local model = models.from_pretrained(folder)
result.load_seconds = native.now() - t0
result.parameters = model:num_parameters()
if mode ~= 'load' then
  torch.manual_seed(0)
  local V = model.config.vocab
  local x = torch.randint(1, V + 1, {B, T})
  if mode == 'forward' then
    torch.no_grad(function() model(x) end)  -- warm-up
    result.forward_seconds = {}
    for i = 1, repeats do
      local s = native.now()
      torch.no_grad(function() model(x) end)
      result.forward_seconds[i] = native.now() - s
    end
  elseif mode == 'autopsy' then
    local y = torch.randint(1, V + 1, {B, T})
    local s = native.now()
    local a = autopsy.run(model, {x, y}, {seq = T})
    result.autopsy_seconds = native.now() - s
    result.autopsy_loss = a.loss
  end
end
fs.write_atomic(out, json.encode(result))
