-- The anatomy side of test_linear_probe_parity.py: probe.linear on the GPT
-- it wrote (three layers), its ids and labels; writes the split, the
-- labelled positions, the classes and control labels, and every row's
-- fitted losses and accuracies.
--   anatomy linear_probe_parity.lua INPUT.safetensors OUTPUT.safetensors
local input, output = arg[1], arg[2]
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local model, w = require('parity_gpt').load(input, 3)
local p = probe.linear(model, w['input.ids'], w['input.labels'], {mask = w['input.mask']:ne(0), control = true, steps = 150,
  lr = 0.05, weight_decay = 1e-3, seed = 2})
local function col(key)
  local out = {}
  for i, r in ipairs(p.rows) do out[i] = r[key] end
  return torch.tensor(out, {dtype = 'float64'})
end
torch.save_safetensors(output, {train_examples = torch.tensor(p.train_examples, {dtype = 'int64'}), positions = p.positions,
  labels = p.labels, control_labels = p.control_labels, train_loss = col('train_loss'), control_train_loss = col('control_train_loss'),
  train_acc = col('train_acc'), test_acc = col('test_acc'), control_acc = col('control_acc')})
