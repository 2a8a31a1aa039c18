-- anatomy: what scripts and the REPL see. The torch table (anatomy.torch)
-- and the library's parts as globals; the library's own files take what they
-- use with require and read no global.
local torch = require('anatomy.torch')
local native = require('anatomy.torch.native')
_G.torch = torch

-- The library's parts are globals in scripts and the REPL, like torch, in
-- the order they load.
local globals = {
  {'nn', 'anatomy.nn'}, {'models', 'anatomy.models'}, {'data', 'anatomy.data'}, {'optim', 'anatomy.optim'},
  {'train', 'anatomy.train'}, {'text', 'anatomy.data.text'}, {'probe', 'anatomy.probe'},
  {'patching', 'anatomy.probe.patching'}, {'steer', 'anatomy.probe.steer'}, {'lens', 'anatomy.probe.lens'},
  {'weights', 'anatomy.probe.weights'}, {'sae', 'anatomy.features'}, {'autopsy', 'anatomy.autopsy'},
  {'hub', 'anatomy.io.hub'}, {'experiment', 'anatomy.experiment'}, {'exact', 'anatomy.exact'}, {'dist', 'anatomy.torch.dist'},
}
torch.nn = require('anatomy.nn')
for _, g in ipairs(globals) do _G[g[1]] = require(g[2]) end
local dist = require('anatomy.torch.dist')
torch.distributed = dist
-- the global provenance: the record (io/provenance.lua) and its text (render/provenance.lua)
provenance = {}
for k, v in pairs(require('anatomy.io.provenance')) do provenance[k] = v end
for k, v in pairs(require('anatomy.render.provenance')) do provenance[k] = v end
help = require('anatomy.session.help').help

-- Under `anatomy --nproc N` or a launcher (torchrun, a SLURM script) that
-- sets WORLD_SIZE, this process joins the world before the script runs; on
-- a GPU, each rank takes the GPU of its LOCAL_RANK.
if os.getenv('WORLD_SIZE') and not dist.is_initialized() then
  dist.init_process_group()
  if torch.device():match('^cuda') and dist.world_size() > 1 then
    torch.set_default_device('cuda:' .. dist.local_rank())
  end
end

-- Names of native functions, for error messages where Lua's debug info has
-- none (a tail call such as `return x:matmul(y)` loses the call site's name).
do
  local names = {}
  local function record(t, prefix)
    for k, v in pairs(t) do
      if type(v) == 'function' and names[v] == nil then names[v] = prefix .. k end
    end
  end
  record(torch.Tensor, '')
  record(torch, '')
  record(torch.linalg, 'linalg.')
  record(torch.cuda, 'cuda.')
  record(torch.profiler, 'profiler.')
  record(native.blocks, 'nn.')
  record(native.data, 'data.')
  record(native.optim, 'optim.')
  record(torch.metrics, 'metrics.')
  record(native.exact, 'exact.')
  record(native.dist, 'dist.')
  for _, meta in ipairs{'anatomy.Corpus', 'anatomy.Native', 'anatomy.Optimizer', 'anatomy.Rational'} do
    record(debug.getregistry()[meta].__index, '')
  end
  debug.getregistry()['anatomy.names'] = names
end

return torch
