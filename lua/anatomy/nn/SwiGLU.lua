-- nn.SwiGLU(dim, hidden, {bias = false}): the gated MLP of Llama,
-- down(silu(gate(x)) * up(x)); children gate, up, down. A built-in block.
-- Hook points: gate(x), pre; up(x), pre_linear; their product, post.
local nn = require('anatomy.nn')
local P, L = nn.point, nn.layouts
return nn.Native.define('SwiGLU', {'dim', 'hidden'}, {'bias'}, {role = 'mlp',
  declares = {P('pre', L.hidden, 'unfused'), P('pre_linear', L.hidden, 'unfused'), P('post', L.hidden, 'unfused')}})
