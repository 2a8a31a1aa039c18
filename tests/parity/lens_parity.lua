-- The anatomy side of test_lens_parity.py: the GPT and the translators it
-- wrote, read through lens.from_translators and lens.logit; writes each
-- row's mean KL to the final distribution and next-token loss.
--   anatomy lens_parity.lua INPUT.safetensors OUTPUT.safetensors
local input, output = arg[1], arg[2]
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local model, w = require('parity_gpt').load(input, 3)
local translators = {}
for i = 0, 2 do
  translators[i] = {weight = w[('input.translator.%d.weight'):format(i)], bias = w[('input.translator.%d.bias'):format(i)]}
end
local tuned = lens.from_translators(model, translators):evaluate(w['input.ids'])
local logit = lens.logit(model):evaluate(w['input.ids'])
torch.save_safetensors(output, {
  tuned_kl = torch.tensor(tuned.kl, {dtype = 'float64'}), tuned_loss = torch.tensor(tuned.loss, {dtype = 'float64'}),
  logit_kl = torch.tensor(logit.kl, {dtype = 'float64'}), logit_loss = torch.tensor(logit.loss, {dtype = 'float64'})})
