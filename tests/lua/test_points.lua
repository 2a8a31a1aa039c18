-- Hook points as their blocks declare them (nn/hook_point.lua): the built-in
-- blocks' declarations against what their C++ publishes, layouts read from
-- the declaration, a layer's parts found by the roles their blocks declare,
-- the direct resolvers (points.resid, points.part, ...) against
-- TransformerLens's names, and hook entries made by one checked constructor.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, raises, raises_part = H.test, H.eq, H.raises, H.raises_part
local points = require('anatomy.probe.points')
local hooks = require('anatomy.probe.hooks')
local entry = require('anatomy.probe.entry')

local function tiny()
  torch.manual_seed(0)
  local m = models.gpt{vocab = 13, dim = 16, heads = 4, layers = 2, seq = 8, ffn = 32}
  m:eval()
  return m
end

test('each built-in block declares the hook points its C++ publishes, in order, each with a layout and a cost', function()
  local blocks = {nn.Attention(8, 2), nn.RoPEAttention(8, 2), nn.VibeAttention(), nn.MLP(8, 16), nn.SwiGLU(8, 16),
    nn.LayerNorm(8), nn.RMSNorm(8), nn.Linear(2, 2), nn.Embedding(5, 8), nn.GELU()}
  for _, m in ipairs(blocks) do
    eq(m:hook_points(), m._native:hook_points(), nn.typename(m))
    for _, p in ipairs(nn.declared_points(m) or {}) do
      eq(p.layout[1], 'batch', nn.typename(m) .. '.' .. p.name)
      eq(type(p.cost), 'string', nn.typename(m) .. '.' .. p.name)
    end
  end
  eq(nn.Attention(8, 2).block_role, 'attention')
  eq(nn.SwiGLU(8, 16).block_role, 'mlp')
  eq(nn.RMSNorm(8).block_role, 'norm')
  raises(function() nn.point('z', 'heads') end, "nn.point: 'z': layout must be a list of dimension names, got string")
  raises(function() nn.point('z', nn.layouts.heads, 'cheap') end, "nn.point: 'z': cost must be 'free', 'unfused' or 'asked', got cheap")
end)

test('probe.layout reads the declaration: heads and positions where they were, module outputs (batch, pos, ...)', function()
  local m = tiny()
  local want = {['blocks.1.attn.z'] = {3, 2}, ['blocks.1.attn.q'] = {3, 2}, ['blocks.1.attn.result'] = {3, 2},
    ['blocks.1.attn.pattern'] = {2, 3}, ['blocks.1.attn.scores'] = {2, 3}, ['blocks.1.attn'] = {nil, 2},
    ['blocks.1.resid_pre'] = {nil, 2}, ['blocks.1.mlp.post'] = {nil, 2}, ['blocks.1.ln1.scale'] = {nil, 2},
    ['blocks.0.attn.hook_pattern'] = {2, 3}}
  for name, w in pairs(want) do
    local l = probe.layout(m, name)
    eq({l.head, l.pos}, {w[1], w[2]}, name)
  end
  eq(probe.layout(m, 'blocks.1.attn.result').cost, 'asked')
  eq(probe.layout(m, 'blocks.1.attn.z').dims, {'batch', 'pos', 'head', 'd_head'})
  raises(function() probe.layout('blocks.1.attn.z') end, 'probe.layout: model must be a model, got string (probe.layout(model, name))')
  -- a Lua block that publishes a point it does not declare: no layout to read
  local Loose = nn.block('points.Loose', function(self, dim) self.fc = nn.Linear(dim, dim) end)
  function Loose:forward(x) return self:hook('mid', self.fc(x)) end
  m.loose = Loose(16)
  raises(function() probe.layout(m, 'loose.mid') end,
    "probe.layout: 'mid' is a hook point of loose (points.Loose), which declares no hook points (its class's declares lists each point with its layout)")
  raises_part(function() probe.ablate(m, 'loose.mid', {head = 1}) end, "probe.ablate: 'mid' is a hook point of loose (points.Loose)")
  -- declared by name alone (hook_names): a stream point
  Loose.hook_names = {'mid'}
  eq(probe.layout(m, 'loose.mid').dims, nn.layouts.stream)
end)

test("a layer's attention and MLP are found by the roles their blocks declare, not by the names they publish", function()
  local Attn = nn.block('points.Attn', function(self, dim) self.fc = nn.Linear(dim, dim) end)
  Attn.hook_names = {'z'}  -- publishes z, declares no role
  function Attn:forward(x) return self:hook('z', self.fc(x)) end
  local Block = nn.block('points.Block', function(self, dim) self.mixer = Attn(dim); self.ffn = nn.MLP(dim, 2 * dim) end)
  function Block:forward(x) return x + self.ffn(x + self.mixer(x)) end
  local block = Block(8)
  eq(points.role_child(block, 'attn'), nil)
  eq(points.role_child(block, 'mlp'), 'ffn')
  Attn.block_role = 'attention'
  eq(points.role_child(block, 'attn'), 'mixer')
end)

test('points.resid, points.part and the rest name the points TransformerLens names name, for each family', function()
  for _, m in ipairs{tiny(), models.llama{vocab = 13, dim = 16, heads = 4, kv_heads = 2, layers = 2, ffn = 32, seq = 8}} do
    for l = 1, 2 do
      for _, w in ipairs{'pre', 'mid', 'post'} do
        eq(points.resid(m, l, w), probe.from_transformer_lens(m, ('blocks.%d.hook_resid_%s'):format(l - 1, w)))
      end
      eq(points.part(m, l, 'attn'), probe.from_transformer_lens(m, ('blocks.%d.hook_attn_out'):format(l - 1)))
      eq(points.part(m, l, 'mlp'), probe.from_transformer_lens(m, ('blocks.%d.hook_mlp_out'):format(l - 1)))
      eq(points.output(m, l, 'attn'), points.part(m, l, 'attn'), 'a pre-norm block adds its attention\'s output itself')
      eq(points.part(m, l, 'ln2'), probe.from_transformer_lens(m, ('blocks.%d.ln2.hook_out'):format(l - 1)))
    end
    local named, final = pcall(probe.from_transformer_lens, m, 'ln_final.hook_out')
    local norm, why = points.final_norm(m)
    if named then eq(norm, final) else eq(why, 'the model names no final norm (model.final_norm)') end
    eq(points.embedding(m, 'tokens'), probe.from_transformer_lens(m, 'hook_embed'))
  end
  local m = tiny()
  raises(function() points.resid(m, 3, 'pre') end, 'layer must be in 1..2, got 3')
  raises(function() points.resid(m, 1, 'middle') end, "points.resid: where must be 'pre', 'mid' or 'post', got middle")
  raises(function() points.part(m, 1, 'ffn') end, "points.part: role must be 'attn', 'mlp', 'ln1', 'ln2', 'ln1_post' or 'ln2_post', got ffn")
  local _, why = points.embedding(models.llama{vocab = 13, dim = 16, heads = 4, layers = 1, ffn = 32, seq = 8}, 'positions')
  eq(why, 'the model has no positional embedding child (its positions are rotary, or inside another block)')
end)

test('hook entries come from one checked constructor: an unknown or mistyped field is an error naming it', function()
  local m = tiny()
  local attn = points.module(m, 'blocks.1.attn')
  raises_part(function() hooks.attach(attn, 'blocks.1.attn', {kind = 'replace', fn = function() end, fnn = 1}) end,
    "probe entry: unknown field 'fnn' (fields: ")
  raises(function() hooks.attach(attn, 'blocks.1.attn', {kind = 'replace', fn = 'zero'}) end,
    "probe entry: field 'fn' must be a function (a replacement: fn(t, name[, input]) -> the tensor to use, or nil), got string")
  raises(function() hooks.attach(attn, 'blocks.1.attn', {kind = 'ablate', fn = function() end}) end,
    "probe entry: field 'kind' must be 'capture', 'replace', 'skip' or 'idle', got ablate")
  raises(function() entry.new{kind = 'capture'} end, "probe entry: a 'capture' entry needs field 'record'")
  raises(function() entry.new{kind = 'idle', hook = true} end, "probe entry: a hook entry (hook = true) needs field 'match'")
  eq(probe.list(m), {}, 'nothing attached by the refused entries')
  local h = probe.replace(m, 'blocks.1.attn.z', function() end)
  local e = h.attached[1][2]
  eq(entry.is(e), true)
  raises(function() e.publishes = {'z.extra', 3} end, "probe entry: field 'publishes'[2] must be a string, got number")
  raises_part(function() e.lable = 'x' end, "probe entry: unknown field 'lable'")
  h:remove()
end)

H.done()
