-- nn.HyperConnections(f, dim, {streams = 4, constraint = 'sinkhorn'|'none', iters = 20, init_std = 0.2})
--
-- The residual stream widened to n copies. With x_l of shape (..., n, C):
--   x_{l+1} = H_res x_l + H_postᵀ f(H_pre x_l)
-- where H_res is n x n (mixes the streams), H_pre is 1 x n (reads f's input
-- from the streams) and H_post is 1 x n (writes f's output back to them).
--
-- Parameterisation: static coefficients (learned, not computed from the
-- input), one set per wrapped block:
--   res_logits (n x n), init I + N(0, init_std²); pre_logits, post_logits (1 x n), init 0.
--   constraint = 'sinkhorn' (DeepSeek's mHC):
--     H_res  = Sinkhorn–Knopp(exp(res_logits)): `iters` rounds of row then
--              column normalisation, a doubly-stochastic matrix (rows and
--              columns sum to 1), so mixing cannot amplify the streams;
--     H_pre  = 2 sigmoid(pre_logits) / n, a mean of the streams at init;
--     H_post = 2 sigmoid(post_logits), 1 at init.
--   constraint = 'none' (the original hyper-connections, unconstrained):
--     H_res = res_logits, H_pre = 1/n + pre_logits, H_post = 1 + post_logits.
-- Use nn.ExpandStreams(n) before the first block and nn.MergeStreams() after
-- the last to go between (..., C) and (..., n, C).
local torch = require('anatomy.torch')
local options = require('anatomy.torch.options')
local nn = require('anatomy.nn')
local format = require('anatomy.render.format')

local HC = nn.class('nn.HyperConnections', nn.Module)
nn.HyperConnections = HC
-- The residual-wrapper protocol (nn.Gate): f is the child inner; with its
-- output zeroed the block is H_res x, the streams' own mixing.
HC.residual_branch = 'inner'

function HC:__init(inner, dim, opts)
  nn.Module.__init(self)
  nn.check_forward(inner, 'nn.HyperConnections: inner', 3)
  opts = opts or {}
  local n = options.whole(opts.streams, 'streams', 'nn.HyperConnections', 4, 1, 4)
  local constraint = opts.constraint or 'sinkhorn'
  if constraint ~= 'sinkhorn' and constraint ~= 'none' then
    error(("nn.HyperConnections: constraint must be 'sinkhorn' or 'none', got '%s'"):format(tostring(constraint)), 3)
  end
  rawset(self, 'streams', n)
  rawset(self, 'dim', dim)
  rawset(self, 'constraint', constraint)
  rawset(self, 'iters', options.whole(opts.iters, 'iters', 'nn.HyperConnections', 20, 0, 4))
  local std = opts.init_std or 0.2
  self.res_logits = nn.Parameter(torch.eye(n) + torch.randn(n, n) * std)
  self.pre_logits = nn.Parameter(torch.zeros(1, n))
  self.post_logits = nn.Parameter(torch.zeros(1, n))
  self.inner = inner
end

-- Sinkhorn–Knopp: alternately normalise rows and columns of a positive matrix.
function nn.sinkhorn(logits, iters)
  if not torch.is_tensor(logits) then error(('nn.sinkhorn: logits must be a Tensor, got %s'):format(type(logits)), 2) end
  if type(iters) ~= 'number' or iters % 1 ~= 0 or iters < 0 or iters > 100000 then
    error(('nn.sinkhorn: iters must be an integer in 0..100000, got %s'):format(tostring(iters)), 2)
  end
  local m = logits:exp()
  for _ = 1, iters do
    m = m / m:sum(2, true)   -- rows sum to 1
    m = m / m:sum(1, true)   -- columns sum to 1
  end
  return m
end

-- hc:mixing() -> H_res (n x n), H_pre (1 x n), H_post (1 x n) as used by forward.
function HC:mixing()
  local n = self.streams
  if self.constraint == 'sinkhorn' then
    return nn.sinkhorn(self.res_logits, self.iters), self.pre_logits:sigmoid() * (2 / n), self.post_logits:sigmoid() * 2
  end
  return self.res_logits, self.pre_logits + 1 / n, self.post_logits + 1
end

-- x: (..., n, C)
function HC:forward(x)
  if x:dim() < 2 or x:size(-2) ~= self.streams or x:size(-1) ~= self.dim then
    error(('nn.HyperConnections expects input of shape (..., %d, %d), got %s (use nn.ExpandStreams(%d) first)')
      :format(self.streams, self.dim, format.shape(x), self.streams), 2)
  end
  local res, pre, post = self:mixing()
  local h = pre:matmul(x):squeeze(-2)                       -- (..., C): f's input
  local y = nn.call_child(self, 'inner', self.inner, h)     -- (..., C)
  return res:matmul(x) + post:t() * y:unsqueeze(-2)         -- (..., n, C)
end

-- The width, the streams and the constraint, as print(model) shows them
function HC:extra_repr()
  return ('%d, streams=%d, constraint=%s'):format(self.dim, self.streams, self.constraint)
end

return HC
