-- nn: modules for anatomy. Blocks built into C++ and blocks written in Lua
-- follow one protocol (nn.Module), so containers, probes and save/load treat
-- them alike. Files load in dependency order.
local nn = {}
package.loaded['anatomy.nn'] = nn  -- the files below require it while it loads

require 'anatomy.nn.class'
require 'anatomy.nn.Module'
require 'anatomy.nn.call_child'
require 'anatomy.nn.incremental'
require 'anatomy.nn.hook_point'
require 'anatomy.nn.Native'
require 'anatomy.nn.Linear'
require 'anatomy.nn.Embedding'
require 'anatomy.nn.LayerNorm'
require 'anatomy.nn.RMSNorm'
require 'anatomy.nn.GELU'
require 'anatomy.nn.ReLU'
require 'anatomy.nn.Dropout'
require 'anatomy.nn.Attention'
require 'anatomy.nn.VibeAttention'
require 'anatomy.nn.MLP'
require 'anatomy.nn.RoPEAttention'
require 'anatomy.nn.SwiGLU'
require 'anatomy.nn.block'
require 'anatomy.nn.Sequential'
require 'anatomy.nn.ModuleList'
require 'anatomy.nn.Repeat'
require 'anatomy.nn.Residual'
require 'anatomy.nn.Gate'
require 'anatomy.nn.MoE'
require 'anatomy.nn.HyperConnections'
require 'anatomy.nn.ExpandStreams'
require 'anatomy.nn.MergeStreams'
require 'anatomy.nn.functional'

return nn
