-- nn: modules for anatomy. Blocks built into C++ and blocks written in Lua
-- follow one protocol (nn.Module), so containers, probes and save/load treat
-- them alike. Files load in dependency order.
local nn = {}
package.loaded['anatomy.nn'] = nn  -- the files below require it while it loads

require 'anatomy.nn.class'
require 'anatomy.nn.Module'
require 'anatomy.nn.native'
require 'anatomy.nn.block'
require 'anatomy.nn.Sequential'
require 'anatomy.nn.Repeat'
require 'anatomy.nn.Residual'
require 'anatomy.nn.Gate'
require 'anatomy.nn.HyperConnections'
require 'anatomy.nn.functional'

return nn
