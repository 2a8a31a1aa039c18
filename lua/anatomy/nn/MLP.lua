-- nn.MLP(dim, hidden, {activation = 'gelu'|'gelu_tanh'|'relu', bias = true}):
-- the feed-forward block, children fc and proj. A built-in block.
return require('anatomy.nn').Native.define('MLP', {'dim', 'hidden'}, {'activation', 'bias'})
