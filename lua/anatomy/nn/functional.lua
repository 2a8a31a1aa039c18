-- nn.functional: stateless functions over tensors (PyTorch's torch.nn.functional).
local nn = require 'anatomy.nn'

local F = {}
nn.functional = F

-- cross_entropy(logits (..., V), targets (...) int64 class ids, 1-based) -> mean loss
function F.cross_entropy(logits, targets) return torch._cross_entropy(logits, targets) end

function F.gelu(x, approximate) return x:gelu(approximate) end
function F.relu(x) return x:relu() end
function F.softmax(x, dim) return x:softmax(dim) end
function F.log_softmax(x, dim) return x:log_softmax(dim) end

return F
