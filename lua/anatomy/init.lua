-- anatomy: what scripts and the REPL see. The torch table (anatomy.torch)
-- and the library's parts as globals; the library's own files take what they
-- use with require and read no global.
local torch = require('anatomy.torch')
local native = require('anatomy.torch.native')
_G.torch = torch

-- nn, models, data, optim, train, text, probe, patching, steer, lens, weights, sae, autopsy, provenance, experiment, exact and dist are globals in scripts and the REPL, like torch.
torch.nn = require 'anatomy.nn'
nn = torch.nn
models = require 'anatomy.models'
data = require 'anatomy.data'
optim = require 'anatomy.optim'
train = require 'anatomy.train'
text = require 'anatomy.data.text'
probe = require 'anatomy.probe'
patching = require 'anatomy.probe.patching'
steer = require 'anatomy.probe.steer'
lens = require 'anatomy.probe.lens'
weights = require 'anatomy.probe.weights'
sae = require 'anatomy.features'
autopsy = require 'anatomy.autopsy'
-- the global: the record (io/provenance.lua) and its text (render/provenance.lua)
provenance = {}
for k, v in pairs(require('anatomy.io.provenance')) do provenance[k] = v end
for k, v in pairs(require('anatomy.render.provenance')) do provenance[k] = v end
hub = require 'anatomy.io.hub'
experiment = require 'anatomy.experiment'
exact = require 'anatomy.exact'
help = require('anatomy.session.help').help
dist = require 'anatomy.torch.dist'
torch.distributed = dist

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
