-- The parts of torch.Tensor written in Lua: hook handles, and the torch.f(x, ...)
-- function forms of tensor methods (torch.matmul(a, b) == a:matmul(b)).
local torch = require('anatomy.core')
local Tensor = torch.Tensor

-- A handle returned by register_hook; handle:remove() detaches the hook.
local Handle = {}
Handle.__index = Handle
function Handle:remove()
  if self.id then
    self.tensor:_remove_hook(self.id)
    self.id = nil
  end
end

-- x:register_hook(fn): fn(grad) runs when x's gradient is computed; it may
-- return a tensor to use instead. Returns a handle with :remove().
function Tensor:register_hook(fn)
  return setmetatable({tensor = self, id = self:_register_hook(fn)}, Handle)
end

local floating = {float32 = true, float64 = true, float16 = true, bfloat16 = true}

-- x:is_floating_point(): float32, float64, float16 or bfloat16
function Tensor:is_floating_point() return floating[self.dtype] == true end

-- Methods that PyTorch also offers as torch.name(tensor, ...).
local functions = {
  'exp', 'log', 'log2', 'log10', 'log1p', 'expm1', 'sqrt', 'rsqrt', 'square', 'abs', 'neg', 'sign',
  'reciprocal', 'floor', 'ceil', 'round', 'trunc', 'sin', 'cos', 'tan', 'asin', 'acos', 'atan',
  'sinh', 'cosh', 'tanh', 'sigmoid', 'relu', 'silu', 'erf', 'isnan', 'isinf', 'isfinite', 'logical_not',
  'add', 'sub', 'mul', 'div', 'remainder', 'maximum', 'minimum', 'atan2', 'pow', 'clamp', 'clip',
  'eq', 'ne', 'lt', 'le', 'gt', 'ge', 'logical_and', 'logical_or',
  'matmul', 'mm', 'bmm', 'dot', 'outer', 'softmax', 'log_softmax', 'gelu',
  'sum', 'mean', 'logsumexp', 'std', 'var', 'norm', 'max', 'min', 'argmax', 'argmin', 'cumsum',
  'all', 'any', 'topk', 'sort', 'index_select', 'gather', 'scatter', 'scatter_add', 'masked_fill',
  'masked_select', 'tril', 'triu', 'reshape', 'flatten', 'transpose', 't', 'permute', 'squeeze',
  'unsqueeze', 'narrow', 'select', 'chunk', 'split', 'unbind', 'clone', 'detach', 'numel',
}
for _, name in ipairs(functions) do
  if torch[name] == nil then torch[name] = Tensor[name] end
end

return Tensor
