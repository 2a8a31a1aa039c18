-- nn.Residual(f): x + f(x). The identity path is what carries gradient past f.
-- nn.NoResidual(f): f(x) alone, the ablation that removes that path.
local nn = require('anatomy.nn')

local Residual = nn.class('nn.Residual', nn.Module)
nn.Residual = Residual

function Residual:__init(inner)
  nn.Module.__init(self)
  nn.check_forward(inner, 'nn.Residual: inner', 3)
  self.inner = inner
end

-- Hook points: the stream the block reads and the one it writes.
Residual.declares = {nn.point('resid_pre', nn.layouts.stream), nn.point('resid_post', nn.layouts.stream)}

-- x + f(x), publishing resid_pre (x) and resid_post
function Residual:forward(x)
  x = self:hook('resid_pre', x)
  return self:hook('resid_post', x + nn.call_child(self, 'inner', self.inner, x))
end

local NoResidual = nn.class('nn.NoResidual', Residual)  -- the same child; only forward differs
nn.NoResidual = NoResidual

-- f(x) alone: the same block without its identity path
function NoResidual:forward(x)
  x = self:hook('resid_pre', x)
  return self:hook('resid_post', nn.call_child(self, 'inner', self.inner, x))
end

return Residual
