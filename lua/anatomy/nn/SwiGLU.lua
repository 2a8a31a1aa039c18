-- nn.SwiGLU(dim, hidden, {bias = false}): the gated MLP of Llama,
-- down(silu(gate(x)) * up(x)); children gate, up, down. A built-in block.
return require('anatomy.nn').Native.define('SwiGLU', {'dim', 'hidden'}, {'bias'})
