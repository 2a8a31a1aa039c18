-- Tensor operations on seeded random inputs, printed as JSON lines (name,
-- shape, values; or a printed form). test_tensor_parity.py computes the same
-- in PyTorch and compares. Inputs are drawn in the same order on both sides:
-- LibTorch's generator gives the same numbers for the same seed.
torch.manual_seed(1234)
local A = torch.randn(4, 5)
local B = torch.randn(5, 3)
local C = torch.randn(4, 5)
local v = torch.randn(5)
local P = torch.rand(4, 5) + 0.1
local X3 = torch.randn(2, 3, 4)
local Y3 = torch.randn(2, 4, 5)
local idx = torch.randint(1, 6, {4, 2})       -- 1-based indices into dim 2 of A
local W1 = torch.randn(5, 8, {requires_grad = true})
local b1 = torch.randn(8, {requires_grad = true})
local W2 = torch.randn(8, 3, {requires_grad = true})
local x = torch.randn(4, 5, {requires_grad = true})
local targets = torch.randint(1, 4, {4, 1})     -- 1-based classes

local function json_string(s)
  return '"' .. s:gsub('\\', '\\\\'):gsub('"', '\\"'):gsub('\n', '\\n') .. '"'
end

local function emit(name, t)
  t = t:detach():double():contiguous()
  local parts = {}
  for i, value in ipairs(t:reshape(-1):tolist()) do parts[i] = string.format('%.17g', value) end
  print(string.format('{"name": %s, "shape": [%s], "values": [%s]}', json_string(name),
    table.concat(t:size(), ', '), table.concat(parts, ', ')))
end

local function emit_repr(name, t)
  print(string.format('{"name": %s, "repr": %s}', json_string(name), json_string(tostring(t):match('\n(.*)$'))))
end

emit('add_broadcast', A + v)
emit('arith', A * C - A / P + 2 * A - 1)
emit('pow', P ^ 2.5)
emit('pow_tensor', P:pow(P))
emit('matmul', A:matmul(B))
emit('bmm', X3:bmm(Y3))
emit('matmul_batched', X3:matmul(Y3[1]))
emit('einsum', torch.einsum('bij,bjk->bik', X3, Y3))
for _, f in ipairs{'exp', 'abs', 'sin', 'cos', 'tanh', 'sigmoid', 'relu', 'gelu', 'neg', 'square'} do
  emit('unary_' .. f, A[f](A))
end
for _, f in ipairs{'log', 'sqrt', 'rsqrt', 'reciprocal'} do emit('positive_' .. f, P[f](P)) end
emit('gelu_tanh', A:gelu('tanh'))
emit('softmax', A:softmax(2))
emit('log_softmax', A:log_softmax(1))
emit('clamp', A:clamp(-0.5, 0.5))
emit('sum_keepdim', A:sum(2, true))
emit('mean', A:mean(1))
emit('std', A:std(2))
emit('var_biased', A:var(1, {unbiased = false}))
emit('norm3', A:norm(3, 2))
emit('logsumexp', A:logsumexp(2))
emit('cumsum', A:cumsum(1))
local mx, mi = A:max(2)
emit('max_values', mx)
emit('max_indices', mi)
emit('argmin', A:argmin(1))
emit('argmax_flat', A:argmax())
local tv, ti = A:topk(2, 2)
emit('topk_values', tv)
emit('topk_indices', ti)
emit('gt', A:gt(0))
emit('index_select', A:index_select(2, idx[{{}, 1}]))
emit('gather', A:gather(2, idx))
emit('scatter', torch.zeros(4, 5):scatter(2, idx, C[{{}, {1, 2}}]))
emit('masked_fill', A:masked_fill(A:lt(0), -1))
emit('where', torch.where(A:gt(0), A, C))
emit('tril', A:tril(-1))
emit('triu', A:triu(1))
emit('svdvals', torch.linalg.svdvals(A))
emit('linalg_norm', torch.linalg.norm(A))
emit('linalg_nuc', torch.linalg.norm(A, 'nuc'))
emit('permute', X3:permute(3, 1, 2):contiguous())
emit('transpose_reshape', X3:transpose(2, 3):reshape(2, -1))
emit('cat', torch.cat({A, C}, 2))
emit('stack', torch.stack({A, C}, 2))
emit('indexing', A[{{2, 4}, -1}])

-- autograd: a two-layer MLP with a cross-entropy written from tensor ops
local h = x:matmul(W1) + b1
local logits = h:gelu():matmul(W2)
local loss = -(logits:log_softmax(2):gather(2, targets)):mean()
loss:backward()
emit('mlp_loss', loss)
emit('mlp_grad_W1', W1.grad)
emit('mlp_grad_b1', b1.grad)
emit('mlp_grad_W2', W2.grad)
emit('mlp_grad_x', x.grad)
-- autograd through softmax, norms and tanh
local y = (x:softmax(2) * x):sum() + x:tanh():norm() + (x * x):mean(1):sum()
x.grad = nil
y:backward()
emit('misc_grad_x', x.grad)

-- the PyTorch pieces added for writing models: flip, median, clamp variants, activations, nn.functional
local F = nn.functional
emit('flip', X3:flip(1, 3))
emit('median_all', A:median())
local mv, mi = A:median(2)
emit('median_values', mv)
emit('median_indices', mi)
emit('clamp_int', idx:clamp(2, 4))
emit('clamp_min', A:clamp_min(0))
emit('clamp_max', A:clamp_max(0.5))
emit('softplus', A:softplus(2, 1))
emit('silu', F.silu(A))
emit('layer_norm', F.layer_norm(X3, {4}, v:narrow(1, 1, 4), P[1]:narrow(1, 1, 4)))
emit('layer_norm_2d', F.layer_norm(X3, {3, 4}))
emit('rms_norm', F.rms_norm(X3, {4}, v:narrow(1, 1, 4)))
emit('mse_loss', F.mse_loss(A, C))
emit('mse_loss_sum', F.mse_loss(A, C, {reduction = 'sum'}))
emit('linear', F.linear(A, B:t(), v:narrow(1, 1, 3)))
emit('embedding', F.embedding(idx, A:t()))
emit('sdpa', F.scaled_dot_product_attention(X3, X3, X3))
emit('sdpa_causal', F.scaled_dot_product_attention(X3, X3, X3, {is_causal = true}))
emit('sdpa_mask', F.scaled_dot_product_attention(X3, X3, X3, {attn_mask = torch.ones(3, 3, {dtype = 'bool'}):tril(), scale = 0.5}))
-- cross_entropy's options, as PyTorch's (classes 1-based here)
local classes = torch.tensor({1, 3, 5, 2}):long()
emit('ce_mean', F.cross_entropy(A, classes))
emit('ce_none', F.cross_entropy(A, classes, {reduction = 'none'}))
emit('ce_sum', F.cross_entropy(A, classes, {reduction = 'sum'}))
emit('ce_ignore', F.cross_entropy(A, torch.tensor({1, 0, 5, 0}):long(), {ignore_index = 0}))
emit('ce_ignore_none', F.cross_entropy(A, torch.tensor({1, 0, 5, 0}):long(), {ignore_index = 0, reduction = 'none'}))
emit('ce_smooth_weight', F.cross_entropy(A, classes, {label_smoothing = 0.1, weight = P[1]}))
emit('ce_3d_none', F.cross_entropy(X3, torch.tensor({{1, 4, 2}, {3, 3, 1}}):long(), {reduction = 'none'}))

-- printing: the body of tostring(x) is PyTorch's str(x)
emit_repr('repr_A', A)
emit_repr('repr_big', A:matmul(B) * 1000)
emit_repr('repr_small', P * 1e-5)
emit_repr('repr_int', idx)
emit_repr('repr_large', torch.arange(1500):reshape(30, 50):float() / 7)
emit_repr('repr_bool', A:gt(0))
