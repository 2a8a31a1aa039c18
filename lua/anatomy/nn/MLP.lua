-- nn.MLP(dim, hidden, {activation = 'gelu'|'gelu_tanh'|'relu', bias = true}):
-- the feed-forward block, children fc and proj. A built-in block. Hook
-- points: the hidden layer before the activation, pre, and after, post.
local nn = require('anatomy.nn')
return nn.Native.define('MLP', {'dim', 'hidden'}, {'activation', 'bias'}, {role = 'mlp',
  declares = {nn.point('pre', nn.layouts.hidden, 'unfused'), nn.point('post', nn.layouts.hidden, 'unfused')}})
