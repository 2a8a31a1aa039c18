-- models.process_weights (TransformerLens's weight processing): each step
-- alone and all together leave the model's probabilities as they were, on
-- GPT-2 (LayerNorm, tied head), GPT-NeoX (parallel residual, untied head)
-- and a grouped-query Llama (RMSNorm, tied head), a Mixtral and a
-- Qwen3-MoE (ln2 into the router and every expert, the routing unchanged); what each step promises
-- holds (norms at 1 and 0, writing weights centred, the head centred over
-- the vocabulary, no value bias); a tied head is untied; what cannot be done
-- is an error that names it, and a processed model is not saved as a
-- checkpoint. TransformerLens itself: tests/parity/test_process_parity.py.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, close, raises, raises_part = H.test, H.eq, H.close, H.raises, H.raises_part

local V = 40
local configs = {
  gpt2 = {model_type = 'gpt2', vocab_size = V, n_positions = 16, n_embd = 16, n_layer = 2, n_head = 4, initializer_range = 0.3},
  neox = {model_type = 'gpt_neox', vocab_size = V, max_position_embeddings = 16, hidden_size = 16, num_hidden_layers = 2,
    num_attention_heads = 4, intermediate_size = 32, rotary_pct = 0.5, use_parallel_residual = true, tie_word_embeddings = false,
    initializer_range = 0.3},
  llama = {model_type = 'llama', vocab_size = V, max_position_embeddings = 16, hidden_size = 16, num_hidden_layers = 2,
    num_attention_heads = 4, num_key_value_heads = 2, intermediate_size = 32, tie_word_embeddings = true, initializer_range = 0.3},
  qwen2 = {model_type = 'qwen2', vocab_size = V, max_position_embeddings = 16, hidden_size = 16, num_hidden_layers = 2,
    num_attention_heads = 4, num_key_value_heads = 2, intermediate_size = 32, initializer_range = 0.3},
}
local ALL = {fold_ln = true, center_writing_weights = true, center_unembed = true, fold_value_biases = true}

-- a model of the config whose norms and biases are away from 1 and 0 (so that folding them shows)
local function make(name)
  local m
  if name == 'gpt' then  -- built in Lua
    torch.manual_seed(5)
    m = models.gpt{vocab = V, dim = 16, heads = 4, layers = 2, seq = 16, ffn = 32, norm = 'pre', activation = 'gelu'}
    m:eval()
  else
    m = models.from_config(configs[name], {seed = 5})
  end
  torch.manual_seed(6)
  torch.no_grad(function()
    for pname, p in m:named_parameters() do
      if pname:find('norm') or pname:find('ln') or pname:find('bias') then p:add_(torch.randn(unpack(p:size())) * 0.3) end
    end
  end)
  return m
end

local ids = torch.randint(1, V + 1, {2, 12})
local function logprobs(m) return m(ids):double():log_softmax(-1) end

test('each step alone and all together keep the log-probabilities (GPT-2, GPT-NeoX, grouped-query Llama and Qwen2, models.gpt)', function()
  for _, name in ipairs({'gpt2', 'neox', 'llama', 'qwen2', 'gpt'}) do
    local want = logprobs(make(name))
    local steps = name == 'llama' and {'fold_ln', 'center_unembed'}  -- RMSNorm, no value biases
      or name == 'qwen2' and {'fold_ln', 'center_unembed', 'fold_value_biases'}  -- RMSNorm; value biases, no output bias
      or {'fold_ln', 'center_writing_weights', 'center_unembed', 'fold_value_biases'}
    for _, k in ipairs(steps) do
      local m = models.process_weights(make(name), {[k] = true})
      close(logprobs(m), want, 2e-5, name .. ' ' .. k)
      eq(m.processed[k], true)
    end
    local all = {}
    for _, k in ipairs(steps) do all[k] = true end
    close(logprobs(models.process_weights(make(name), all)), want, 2e-5, name .. ' all')
  end
end)

test('what each step promises: norms at 1 and 0, writing weights and the head centred, no value bias', function()
  local m = models.process_weights(make('gpt2'), ALL)
  local p = {}
  for n, t in m:named_parameters() do p[n] = t:double() end
  for _, n in ipairs({'h.1.ln_1', 'h.2.ln_2', 'ln_f'}) do
    eq(p[n .. '.weight']:eq(1):all():item(), true, n .. ' weight')
    eq(p[n .. '.bias']:eq(0):all():item(), true, n .. ' bias')
  end
  close(p['wte.weight']:mean(2), torch.zeros(V, {dtype = 'float64'}), 1e-6, 'W_E centred over the model dimension')
  close(p['wpe.weight']:mean(2), torch.zeros(16, {dtype = 'float64'}), 1e-6, 'W_pos centred')
  close(p['h.2.attn.proj.weight']:mean(1), torch.zeros(16, {dtype = 'float64'}), 1e-6, 'W_O centred over its output')
  close(p['h.1.mlp.proj.bias']:mean(), 0, 1e-6, 'b_out centred')
  close(p['lm_head.weight']:mean(1), torch.zeros(16, {dtype = 'float64'}), 1e-6, 'W_U centred over the vocabulary')
  close(p['lm_head.bias']:mean(), 0, 1e-6, 'b_U centred')
  eq(p['h.1.attn.qkv.bias']:narrow(1, 33, 16):eq(0):all():item(), true, 'value biases folded away')
  close(p['h.1.attn.qkv.weight']:mean(2), torch.zeros(48, {dtype = 'float64'}), 1e-6, 'reading weights centred (LayerNorm)')
end)

test('a tied head is untied: the embedding and the head change differently; print(model) says what was done', function()
  local m = models.process_weights(make('gpt2'), {center_writing_weights = true})
  eq(m.lm_head ~= nil, true)
  eq(m.config.tied, false)
  eq((m.lm_head.weight - m.wte.weight):abs():max():item() > 1e-3, true, 'the head kept the uncentred embedding')
  local text = tostring(m)
  eq(text:find('weights processed (center_writing_weights)', 1, true) ~= nil, true, text:match('[^\n]*'))
  local l = models.process_weights(make('llama'), {fold_ln = true})
  eq(l.lm_head ~= nil and (l.lm_head.weight - l.embed_tokens.weight):abs():max():item() > 1e-3, true)
end)

test('from_pretrained takes the steps as options, before any dtype conversion', function()
  local dir = H.tmpdir()
  make('gpt2'):save_pretrained(dir)
  local plain = models.from_pretrained(dir)
  local m = models.from_pretrained(dir, {fold_ln = true, center_unembed = true})
  eq(m.processed.fold_ln and m.processed.center_unembed and not m.processed.center_writing_weights, true)
  close(logprobs(m), logprobs(plain), 2e-5)
  local half = models.from_pretrained(dir, {fold_ln = true, dtype = 'bfloat16'})
  eq(half.lm_head.weight.dtype, 'bfloat16')
  -- processed in float32, then rounded once: the float32 model's processed weights, rounded
  local full = models.from_pretrained(dir, {fold_ln = true})
  eq((half.h[1].attn['qkv.weight']:float() - full.h[1].attn['qkv.weight']:to('bfloat16'):float()):abs():max():item(), 0)
  raises(function() models.from_pretrained(dir, {fold_ln = 1}) end, 'models.from_pretrained: fold_ln must be true or false, got 1')
  raises_part(function() models.from_pretrained(dir, {fold_layernorm = true}) end, "models.from_pretrained: unknown option 'fold_layernorm'")
  raises_part(function() m:save_pretrained(H.tmpdir()) end, 'save_pretrained: the weights are processed (fold_ln, center_unembed)')
end)

test('what cannot be done is an error naming it', function()
  raises(function() models.process_weights(make('llama'), {center_writing_weights = true}) end,
    'models.process_weights: center_writing_weights needs LayerNorm; models.Llama uses nn.RMSNorm, which does not take the mean out of the stream')
  local once = models.process_weights(make('gpt2'), {fold_ln = true})
  raises(function() models.process_weights(once, {fold_ln = true}) end, 'models.process_weights: the model is processed already (fold_ln)')
  raises(function() models.process_weights(models.gpt{vocab = 8, dim = 8, heads = 2, layers = 1, seq = 8, ffn = 16}, ALL) end,
    "models.process_weights: a post-norm models.gpt (its norms read the residual sums, not the attention's and MLP's inputs) has no "
    .. "weights to fold them into; build it with norm = 'pre'")
  raises(function() models.process_weights(nn.Sequential{nn.Linear(2, 2)}, ALL) end,
    'models.process_weights: nn.Sequential declares no layout to process: a model from models.from_pretrained, models.gpt '
    .. "(norm = 'pre'), or a class with processing_names() -> {embed, stack, norm, head} (the names of its children)")
  -- a bias-free Llama has no value biases: refused, not marked as processed
  local llama = make('llama')
  raises(function() models.process_weights(llama, {fold_value_biases = true}) end,
    'models.process_weights: fold_value_biases: models.Llama has no value biases, so there is nothing to fold (leave the step out)')
  eq(llama.processed, nil, 'nothing marked as done')
  -- Qwen2's value biases go into an output bias added for them, as TransformerLens's b_O
  local qwen = models.process_weights(make('qwen2'), {fold_value_biases = true})
  local p = {}
  for n, t in qwen:named_parameters() do p[n] = t end
  eq(p['blocks.1.self_attn.v.bias']:abs():max():item(), 0, 'the value bias is folded away')
  assert(p['blocks.1.self_attn.o.bias'] ~= nil and p['blocks.1.self_attn.o.bias']:abs():max():item() > 0, 'into a new output bias')
  raises(function() models.process_weights(make('gpt2'), {fold_ln = 'yes'}) end, 'models.process_weights: fold_ln must be true or false, got yes')
end)

-- a Mixtral and a Qwen3-MoE with a dense layer between two sparse ones (their norms away from 1)
local moe_configs = {
  mixtral = {model_type = 'mixtral', vocab_size = V, max_position_embeddings = 16, hidden_size = 16, num_hidden_layers = 2,
    num_attention_heads = 4, num_key_value_heads = 2, intermediate_size = 32, num_local_experts = 4, num_experts_per_tok = 2,
    initializer_range = 0.3},
  qwen3_moe = {model_type = 'qwen3_moe', vocab_size = V, max_position_embeddings = 16, hidden_size = 16, num_hidden_layers = 3,
    num_attention_heads = 4, num_key_value_heads = 2, head_dim = 8, intermediate_size = 32, moe_intermediate_size = 24,
    num_experts = 4, num_experts_per_tok = 2, mlp_only_layers = {1}, initializer_range = 0.3},
}
local function make_moe(name)
  local m = models.from_config(moe_configs[name], {seed = 5})
  torch.manual_seed(6)
  torch.no_grad(function()
    for pname, p in m:named_parameters() do if pname:find('norm') then p:add_(torch.randn(unpack(p:size())) * 0.3) end end
  end)
  return m
end

test('a mixture of experts: fold_ln moves each ln2 into the router and every expert; logits and routing unchanged', function()
  for name, L in pairs({mixtral = 2, qwen3_moe = 3}) do
    local filter = {}
    for l = 1, L do
      if name == 'mixtral' or l ~= 2 then
        filter[#filter + 1] = ('blocks.%d.mlp.router_logits'):format(l); filter[#filter + 1] = ('blocks.%d.mlp.expert_indices'):format(l)
      end
    end
    local plain = make_moe(name)
    torch.manual_seed(7)
    local ids = torch.randint(1, V + 1, {2, 12})
    local want, wcache = probe.run_with_cache(plain, ids, {filter = filter})
    local m = models.process_weights(make_moe(name), {fold_ln = true})
    local got, gcache = probe.run_with_cache(m, ids, {filter = filter})
    close(got:double(), want:double(), 1e-5, name .. ' logits after fold_ln')
    for _, k in ipairs(filter) do
      if k:find('indices') then eq(gcache[k]:eq(wcache[k]):all():item(), true, name .. ' ' .. k .. ': the same experts')
      else close(gcache[k]:double(), wcache[k]:double(), 1e-5, name .. ' ' .. k) end
    end
    local p, before = {}, {}
    for n, t in m:named_parameters() do p[n] = t:double() end
    for n, t in plain:named_parameters() do before[n] = t:double() end
    local ln2 = before['blocks.1.post_attention_layernorm.weight']
    eq(p['blocks.1.post_attention_layernorm.weight']:eq(1):all():item(), true, name .. ' ln2 at 1')
    for _, k in ipairs({'blocks.1.mlp.gate.weight', 'blocks.1.mlp.experts.3.gate.weight', 'blocks.1.mlp.experts.3.up.weight'}) do
      close(p[k], before[k] * ln2:unsqueeze(1), 1e-6, name .. ' ' .. k .. ' scaled by ln2')
    end
    eq((p['blocks.1.mlp.experts.3.down.weight'] - before['blocks.1.mlp.experts.3.down.weight']):abs():max():item(), 0, name .. ' down as it was')
    local both = models.process_weights(make_moe(name), {fold_ln = true, center_unembed = true})
    close(both(ids):double():log_softmax(-1), want:double():log_softmax(-1), 1e-5, name .. ' fold_ln, center_unembed')
    -- direct logit attribution reads each nn.MoE's output as the layer's MLP (refused before: no 'post' point there)
    local dla, mlp = probe.logit_attribution(m, ids, 3), 0
    for _, row in ipairs(dla.rows) do if row[1]:match('^blocks%.%d+%.mlp$') then mlp = mlp + 1 end end
    eq(mlp, L, name .. ' an MLP row per layer')
    close(dla.total, dla.logit, 1e-4, name .. ' the rows sum to the logit')
  end
  -- an MoE after a LayerNorm: TransformerLens's bridge leaves it unfolded, and anatomy refuses
  local m = make_moe('mixtral')
  m.blocks[2].post_attention_layernorm = nn.LayerNorm(16)
  raises(function() models.process_weights(m, {fold_ln = true}) end,
    "models.process_weights: fold_ln: blocks.2.mlp is an nn.MoE after nn.LayerNorm; TransformerLens folds a mixture of experts's own "
    .. "RMSNorm only (it leaves a norm with a shift or one shared with the attention unfolded, and the experts' outputs uncentred)")
  eq(m.processed, nil, 'nothing marked as done')
end)

H.done()
