-- The anatomy side of test_process_parity.py: a Hugging Face folder through
-- models.from_pretrained twice, as it is and with the weight processing the
-- options name; the processed weights in TransformerLens's layout, both
-- models' logits on the ids given, and the processed model's direct logit
-- attribution of a token at the last position.
-- arg: folder, options (comma-separated names), ids.safetensors, target (1-based), out.safetensors
local opts = {}
for k in arg[2]:gmatch('[^,]+') do opts[k] = true end
local plain = models.from_pretrained(arg[1])
local model = models.from_pretrained(arg[1], opts)
local ids = torch.load_safetensors(arg[3]).ids
local target = tonumber(arg[4])
local out = {}
out.logits = model(ids):contiguous()
out.logits_unprocessed = plain(ids):contiguous()
out.W_E = weights.embedding(model):contiguous()
out.W_U = weights.unembedding(model):contiguous()
local names = model.pretrained_names
local head = model[names.head]
if head.bias then out.b_U = head.bias:double() end
if rawget(model, 'wpe') or model.wpe then out.W_pos = model.wpe.weight:double() end
local layers = model:layers()
local stack = {}
for l = 1, #layers do
  local a = weights.attention(model, l)
  for _, k in ipairs({'W_Q', 'W_K', 'W_V', 'W_O', 'b_Q', 'b_K', 'b_V', 'b_O'}) do
    if a[k] then stack[k] = stack[k] or {}; stack[k][l] = a[k]:unsqueeze(1) end
  end
  local mlp = layers[l][2].mlp
  local p = {}
  for n, t in mlp:named_parameters() do p[n] = t:detach():double() end
  local function add(k, t) if t then stack[k] = stack[k] or {}; stack[k][l] = t:unsqueeze(1) end end
  if model.config.moe then  -- each layer's MLP in transformers' names and layout (out x in), experts stacked
    local at = ('blocks.%d.mlp.'):format(l - 1)
    if nn.typename(mlp) == 'nn.MoE' then
      out[at .. 'gate.weight'] = p['gate.weight']
      for _, n in ipairs({'gate', 'up', 'down'}) do
        local list = {}
        for e = 1, mlp.num_experts do list[e] = p[('experts.%d.%s.weight'):format(e, n)]:unsqueeze(1) end
        out[at .. 'experts.' .. n] = torch.cat(list, 1)
      end
    else
      for _, n in ipairs({'gate', 'up', 'down'}) do out[at .. n .. '_proj.weight'] = p[n .. '.weight'] end
    end
  elseif p['fc.weight'] then
    add('W_in', p['fc.weight']:t()); add('b_in', p['fc.bias']); add('W_out', p['proj.weight']:t()); add('b_out', p['proj.bias'])
  else
    add('W_gate', p['gate.weight']:t()); add('W_in', p['up.weight']:t()); add('W_out', p['down.weight']:t())
  end
end
for k, list in pairs(stack) do out[k] = torch.cat(list, 1):contiguous() end
-- every norm that folds left with weight 1 and bias 0 (a scale of 1: weight
-- 0 under Gemma's offset 1); those TransformerLens keeps (Gemma 2/3's
-- post-norms, QK-norms) as they were
local kept = {}
for l = 1, #layers do
  local block = layers[l][2]
  for _, role in ipairs({'ln1_post', 'ln2_post'}) do
    local n = block.norm_roles and block.norm_roles[role]
    if n then kept[layers[l][1] .. '.' .. n .. '.weight'] = true end
  end
end
local before = {}
for name, t in plain:named_parameters() do before[name] = t end
local worst, kept_worst = 0, 0
for name, t in model:named_parameters() do
  if kept[name] or name:find('[qk]_norm') then
    kept_worst = math.max(kept_worst, (t:double() - before[name]:double()):abs():max():item())
  elseif name:find('ln') or name:find('norm') then
    local offset = model.config.family and model.config.family:find('^gemma') and 1 or 0
    local want = name:match('weight$') and 1 - offset or 0
    worst = math.max(worst, (t:double() - want):abs():max():item())
  end
end
out.norm_identity_error = torch.tensor({worst}, {dtype = 'float64'})
out.kept_norm_change = torch.tensor({kept_worst}, {dtype = 'float64'})
-- (not through norms after the parts, Gemma 2/3's: no head's share of the logit passes a post-norm alone)
if not (layers[1][2].norm_roles or {}).ln1_post then
  local dla = probe.logit_attribution(model, ids, target)
  local heads = {}
  for _, row in ipairs(dla.rows) do if row[1]:find(' head ') then heads[#heads + 1] = row[2] end end
  out.dla_heads = torch.tensor(heads, {dtype = 'float64'})
end
for k, v in pairs(out) do out[k] = v:contiguous() end
torch.save_safetensors(arg[5], out)
