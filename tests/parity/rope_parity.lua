-- nn.RoPEAttention and nn.SwiGLU on the weights and input test_rope_parity.py
-- wrote; writes the outputs, the attention pattern and every gradient.
--   anatomy rope_parity.lua CASES.json INPUT.safetensors OUTPUT.safetensors
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')
local cases = json.decode(fs.read(arg[1]))
local w = torch.load_safetensors(arg[2])
local out = {}
for _, c in ipairs(cases) do
  local m
  if c.kind == 'swiglu' then
    m = nn.SwiGLU(c.dim, c.hidden, {bias = c.bias, activation = c.activation})
  else
    m = nn.RoPEAttention(c.dim, c.heads, c.options)
    m:keep_pattern(true)
  end
  local state = {}
  for name in m:named_parameters() do state[name] = w[c.name .. '.' .. name] end
  m:load_state_dict(state)
  local x = w[c.name .. '.x']:clone():requires_grad_(true)
  local y = m(x)
  y:mul(w[c.name .. '.g']):sum():backward()
  out[c.name .. '.y'] = y:detach()
  out[c.name .. '.dx'] = x.grad
  if m.pattern then
    out[c.name .. '.pattern'] = m:pattern()
    -- with no probe asking for the pattern, the fused kernel (LibTorch 2.x) gives the output
    m:keep_pattern(false)
    out[c.name .. '.y_fused'] = torch.no_grad(function() return m(x) end)
  end
  for name, p in m:named_parameters() do out[c.name .. '.grad.' .. name] = p.grad end
end
torch.save_safetensors(arg[3], out)
