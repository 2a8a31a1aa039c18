-- nn.SwiGLU(dim, hidden, {bias = false, activation = 'silu'}): the gated MLP
-- of Llama, down(silu(gate(x)) * up(x)); activation = 'gelu_tanh' (or
-- 'gelu') in place of silu makes Gemma's GeGLU. Children gate, up, down. A built-in block.
-- Hook points: gate(x), pre; up(x), pre_linear; their product, post.
local nn = require('anatomy.nn')
local P, L = nn.point, nn.layouts
return nn.Native.define('SwiGLU', {'dim', 'hidden'}, {'bias', 'activation'}, {role = 'mlp',
  declares = {P('pre', L.hidden, 'unfused'), P('pre_linear', L.hidden, 'unfused'), P('post', L.hidden, 'unfused')}})
