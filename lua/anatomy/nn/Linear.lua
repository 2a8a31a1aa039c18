-- nn.Linear(in, out, {bias = true}): a learned affine map, y = x Wᵀ + b, its
-- weight [out, in] as in PyTorch. A built-in block (host/nn/blocks.cpp).
return require('anatomy.nn').Native.define('Linear', {'in_features', 'out_features'}, {'bias'})
