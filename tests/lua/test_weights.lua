-- weights: factored matrices answer as the matrices they stand for; a head's
-- OV and QK circuits are the products of the slices of its projections; a
-- head built to copy one token to another reads and writes those tokens;
-- composition scores equal the formula computed on full matrices, and are
-- zero where heads cannot compose; bad arguments are errors naming them.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, close, raises, raises_part = H.test, H.eq, H.close, H.raises, H.raises_part

local function fro(t) return torch.linalg.norm(t):item() end

test('a factored matrix: norm, singular values and SVD equal those of the full product, wide or narrow inside', function()
  torch.manual_seed(3)
  for _, dims in ipairs({{7, 3, 5}, {3, 6, 4}, {5, 5, 2}}) do
    local A = torch.randn(dims[1], dims[2], {dtype = 'float64'})
    local B = torch.randn(dims[2], dims[3], {dtype = 'float64'})
    local f, full = weights.factored(A, B), A:matmul(B)
    local r = math.min(dims[1], dims[2], dims[3])
    close(f:norm(), fro(full), 1e-12)
    close(f:singular_values(), torch.linalg.svdvals(full):narrow(1, 1, r), 1e-12)
    local U, S, Vh = f:svd()
    eq(U:size(), {dims[1], r}); eq(Vh:size(), {r, dims[3]})
    close((U * S:unsqueeze(1)):matmul(Vh), full, 1e-12)
    -- the same product transposed: bit for bit on the CPU's BLAS; cuBLAS may
    -- order (A B)^T's sums otherwise (4.4e-16 seen on an H200)
    close(f:t():AB(), full:t(), A.device == 'cpu' and 0 or 1e-12)
    local x = torch.randn(dims[3], 4, {dtype = 'float64'})
    close(f:matmul(x):AB(), full:matmul(x), 1e-12)
    local g = weights.factored(torch.randn(dims[3], 2, {dtype = 'float64'}), torch.randn(2, 3, {dtype = 'float64'}))
    close(f:matmul(g):AB(), full:matmul(g:AB()), 1e-12)
    local y = torch.randn(2, dims[1], {dtype = 'float64'})
    close(f:rmatmul(y):AB(), y:matmul(full), 1e-12)
  end
end)

test('weights.factored and its methods refuse what cannot be multiplied, and NaN', function()
  local a, b = torch.ones(4, 3), torch.ones(2, 5)
  raises(function() weights.factored(a, b) end, "weights.factored: A is 4 x 3 and B is 2 x 5: A's columns (3) must equal B's rows (2)")
  raises(function() weights.factored(torch.ones(3), b) end, 'weights.factored: A must be a matrix (a 2-D tensor), got shape 3')
  raises(function() weights.factored(torch.tensor({{0 / 0}}), torch.ones(1, 1)) end, 'weights.factored: the factors hold NaN or infinite values')
  local f = weights.factored(torch.ones(4, 3), torch.ones(3, 5))
  raises(function() f:matmul(torch.ones(4, 2)) end, 'f:matmul: f is 4 x 5 and x is 4 x 2')
  raises(function() f:rmatmul(torch.ones(2, 5)) end, 'f:rmatmul: x is 2 x 5 and f is 4 x 5')
  raises(function() f:tokens() end, "f:tokens: only a head's circuit (weights.ov, weights.qk) knows its vocabulary")
end)

torch.manual_seed(4)
local C, NH, D = 16, 4, 4
local model = models.gpt{vocab = 16, dim = C, heads = NH, layers = 3, seq = 8, ffn = 32}

test("a head's OV and QK circuits are the products of its slices of qkv and proj", function()
  local qkv, proj = model.blocks[2].attn['qkv.weight'], model.blocks[2].attn['proj.weight']
  for h = 1, NH do
    local rows = function(part) return qkv:narrow(1, part * C + (h - 1) * D + 1, D):double() end  -- (D, C)
    local W_Q, W_K, W_V = rows(0):t(), rows(1):t(), rows(2):t()                              -- (C, D)
    local W_O = proj:narrow(2, (h - 1) * D + 1, D):double():t()                              -- (D, C)
    local ov, qk = weights.ov(model, 2, h), weights.qk(model, 'blocks.2', h)
    close(ov:AB(), W_V:matmul(W_O), 1e-12)
    close(qk:AB(), W_Q:matmul(W_K:t()), 1e-12)
    eq(ov.mdim, D); eq(ov.kind, 'ov'); eq(qk.layer_name, 'blocks.2')
  end
  eq(tostring(weights.ov(model, 3, 1)), 'weights.Factored: OV circuit of blocks.3 head 1, 16 x 16 through 4 (float64)')
end)

test('weights.ov and weights.qk name a bad layer or head, and a model without W_Q..W_O', function()
  raises(function() weights.ov(model, 4, 1) end, 'weights.ov: layer must be in 1..3, got 4')
  raises(function() weights.qk(model, 1, 5) end, 'weights.qk: head must be in 1..4 (blocks.1.attn has 4 heads), got 5')
  raises(function() weights.ov(model, 1, 1.5) end, 'weights.ov: head must be in 1..4 (blocks.1.attn has 4 heads), got 1.5')
  raises(function() weights.ov(model, 'blocks.9', 1) end, "weights.ov: no layer 'blocks.9' (layers: blocks.1, blocks.2, blocks.3)")
  local vibe = models.vibenet{vocab = 8, dim = 8, layers = 2, seq = 8}
  raises_part(function() weights.ov(vibe, 1, 1) end, 'is nn.VibeAttention, whose heads have no W_Q, W_K, W_V, W_O to read')
end)

test('a head built to copy token 3 into token 7 reads 3 and writes 7; its QK reads query 5 against key 9', function()
  local m = models.gpt{vocab = C, dim = C, heads = NH, layers = 1, seq = 8, ffn = 32}
  torch.no_grad(function()
    for _, p in ipairs(m:parameters()) do p:zero_() end
    m.embed.weight:copy_(torch.eye(C))
    m.head.weight:copy_(torch.eye(C))
    local attn = m.blocks[1].attn
    local qkv, proj = attn['qkv.weight'], attn['proj.weight']
    qkv[2 * C + 1][3] = 2    -- head 1's first value dim reads token 3's direction
    proj[7][1] = 1           -- and writes it to token 7's
    qkv[1][5] = 1            -- its first query dim reads token 5
    qkv[C + 1][9] = 3        -- its first key dim reads token 9
  end)
  local ov = weights.ov(m, 1, 1)
  close(ov:singular_values(), {2, 0, 0, 0}, 1e-12)
  local t = ov:tokens{n = 1, k = 1}
  eq(#t, 1); eq(t[1].reads, {3}); eq(t[1].writes, {7}); close(t[1].value, 2, 1e-12)
  local q = weights.qk(m, 1, 1):tokens{n = 1, k = 1}
  eq(q[1].reads, {5}); eq(q[1].writes, {9}); close(q[1].value, 3, 1e-12)
  raises(function() ov:tokens{n = 0} end, 'f:tokens: n must be a whole number >= 1, got 0')
  raises(function() ov:tokens{k = 'x'} end, 'f:tokens: k must be a whole number >= 1, got x')
  raises(function() ov:tokens{top = 1} end, "f:tokens: unknown option 'top' (expected k, n, tokenizer)")
end)

test('composition scores equal |OV_a R_b| / (|OV_a| |R_b|) on full matrices, and are zero unless a is earlier', function()
  for _, mode in ipairs({'q', 'k', 'v'}) do
    local s = weights.composition(model, mode:upper())
    eq(s.scores:size(), {3, NH, 3, NH}); eq(s.mode, mode)
    for la = 1, 3 do
      for lb = 1, 3 do
        for ha = 1, NH do
          for hb = 1, NH do
            local got = s.scores[la][ha][lb][hb]:item()
            if la >= lb then
              eq(got, 0)
            else
              local ov = weights.ov(model, la, ha):AB()
              local r = mode == 'q' and weights.qk(model, lb, hb):AB() or mode == 'k' and weights.qk(model, lb, hb):AB():t()
                or weights.ov(model, lb, hb):AB()
              close(got, fro(ov:matmul(r)) / fro(ov) / fro(r), 1e-12)
            end
          end
        end
      end
    end
    local top = s:top(3)
    eq(#top, 3)
    eq(top[1].score >= top[2].score and top[2].score >= top[3].score, true)
    close(top[1].score, s.scores[top[1].from.layer][top[1].from.head][top[1].to.layer][top[1].to.head]:item(), 0)
    eq(top[1].from.layer < top[1].to.layer, true)
    local svg = s:svg()
    eq(svg:find('<svg', 1, true) ~= nil, true)
    eq(select(2, svg:gsub('>blocks%.1 head 1<', '')) >= 1, true)   -- a row
    eq(select(2, svg:gsub('>blocks%.3 head 4<', '')) >= 1, true)   -- a column
    eq(select(2, svg:gsub('class="missing"', '')) > 0, true)  -- the pairs that cannot compose, blank
  end
  local both = weights.composition(model, {'q', 'v'})
  eq(both.q.mode, 'q'); eq(both.v.mode, 'v')
  raises(function() weights.composition(model, 'o') end, "weights.composition: mode must be 'q', 'k' or 'v' (or 'Q', 'K', 'V'), got o")
  raises(function() weights.composition(model, 'Qk') end, "weights.composition: mode must be 'q', 'k' or 'v' (or 'Q', 'K', 'V'), got Qk")
end)

test('grouped-query attention with query biases (Qwen2): each bias is its own heads\' (the query\'s as it is, keys and values shared)', function()
  local pretrained = require('anatomy.models.pretrained')
  local F = require(pretrained.families.qwen2)
  torch.manual_seed(3)
  local m = F.build(F.check({model_type = 'qwen2', vocab_size = 20, hidden_size = 32, intermediate_size = 64, num_hidden_layers = 2,
    num_attention_heads = 4, num_key_value_heads = 2, max_position_embeddings = 16}, 'test'))
  local attn
  for n, mod in m:named_modules() do if n == 'blocks.1.self_attn' then attn = mod end end
  local params = {}
  for n, p in attn:named_parameters() do params[n] = p:detach():double() end
  torch.no_grad(function()  -- random biases: a zero one would hide a mixed-up head
    for n, p in attn:named_parameters() do if n:find('bias', 1, true) then p:copy_(torch.randn(p:size(1))) end end
  end)
  for n, p in attn:named_parameters() do params[n] = p:detach():double() end
  local w = weights.attention(m, 1)
  eq(w.heads, 4); eq(w.kv_heads, 2); eq(w.head_dim, 8)
  eq(w.b_Q:size(), {4, 8}); eq(w.b_K:size(), {4, 8}); eq(w.b_V:size(), {4, 8})
  for h = 1, 4 do
    local kv = math.floor((h - 1) / 2) + 1  -- query heads 1, 2 read kv head 1; 3, 4 read kv head 2
    close(w.b_Q[h], params['q.bias']:narrow(1, (h - 1) * 8 + 1, 8), 0, 'query bias of head ' .. h)
    close(w.b_K[h], params['k.bias']:narrow(1, (kv - 1) * 8 + 1, 8), 0, 'key bias of head ' .. h)
    close(w.b_V[h], params['v.bias']:narrow(1, (kv - 1) * 8 + 1, 8), 0, 'value bias of head ' .. h)
  end
  -- and everything built on it runs
  eq(tostring(weights.ov(m, 2, 3)), 'weights.Factored: OV circuit of blocks.2 head 3, 32 x 32 through 8 (float64)')
  eq(tostring(weights.qk(m, 2, 3)), 'weights.Factored: QK circuit of blocks.2 head 3, 32 x 32 through 8 (float64)')
  eq(weights.composition(m, 'k').scores:size(), {2, 4, 2, 4})
end)

H.done()
