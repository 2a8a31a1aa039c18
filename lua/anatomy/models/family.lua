-- What a pretrained family's file (models/gpt2.lua, llama.lua, gpt_neox.lua)
-- is made of: the pre-norm residual block and the decoder around the stack,
-- the checks of config.json's numbers and of what anatomy refuses, RoPE's
-- settings and nn.RoPEAttention's options, and what print(model) notes of a
-- checkpoint. models.pretrained (the loader) offers each of them under its
-- own name too (pretrained.dim, pretrained.rope, ...).
local nn = require('anatomy.nn')
local models = require('anatomy.models')
local json = require('anatomy.io.json')
local process = require('anatomy.models.process')

local family = {}

-- The families' pre-norm residual block, x + attn(ln1(x)), then + mlp(ln2(x)),
-- publishing resid_pre, resid_mid and resid_post. Block.hook_names for it:
family.resid_hooks = {'resid_pre', 'resid_mid', 'resid_post'}
-- pretrained.prenorm(block, x, attn, ln1, mlp, ln2) -> x + attn(ln1(x)), then + mlp(ln2(.)), through the block's hook points
function family.prenorm(block, x, attn, ln1, mlp, ln2)
  x = block:hook('resid_pre', x)
  x = block:hook('resid_mid', x + attn(ln1(x)))
  return block:hook('resid_post', x + mlp(ln2(x)))
end

-- pretrained.prenorm_block(class, names, init) -> a block class (nn.block(class, init)) of the pre-norm
-- layout, x + attn(ln1(x)), then + mlp(ln2(.)) (family.prenorm): names = {ln1, attn, ln2, mlp}, its
-- children's names (family.llama_names: Llama's, Phi-3's, Gemma's). It publishes resid_pre, resid_mid and resid_post.
function family.prenorm_block(class, names, init)
  local Block = nn.block(class, init)
  Block.hook_names = family.resid_hooks
  -- block(x) -> x + attn(ln1(x)), then + mlp(ln2(.)), through the hook points
  function Block:forward(x)
    local y = family.prenorm(self, x, self[names.attn], self[names.ln1], self[names.mlp], self[names.ln2])
    return y
  end
  return Block
end
family.llama_names = {ln1 = 'input_layernorm', attn = 'self_attn', ln2 = 'post_attention_layernorm', mlp = 'mlp'}

-- pretrained.parallel_block(class, names, init) -> a block class (nn.block(class, init)) whose one norm
-- feeds attention and MLP in parallel, x + attn(ln(x)) + mlp(ln(x)) (Phi's, GPT-J's): names = {norm, attn,
-- mlp}, its children's names. It publishes resid_pre and resid_post (no resid_mid: the two read the same
-- stream and add together) and declares its norm shared (models.process_weights folds it into both).
function family.parallel_block(class, names, init)
  local Block = nn.block(class, init)
  Block.hook_names = {'resid_pre', 'resid_post'}
  Block.shared_norm = true
  -- block(x) -> x + attn(ln(x)) + mlp(ln(x)), through the hook points
  function Block:forward(x)
    x = self:hook('resid_pre', x)
    local h = self[names.norm](x)
    return self:hook('resid_post', x + self[names.attn](h) + self[names.mlp](h))
  end
  return Block
end

-- What the families' models share (a decoder: embed, a stack of blocks, a
-- final norm, a head tied to the token embedding or not), written once.
-- names: the model's own names of its token embedding, stack, final norm and
-- untied head (and positions, GPT-2's learned ones). A class may define
-- embed(ids) itself (GPT-2 adds positions).
function family.decoder(cls, names)
  cls.final_norm = names.norm  -- whose output is Hugging Face's last hidden state
  cls.pretrained_names = names  -- the embedding, the stack, the final norm and the head (models.process_weights)
  -- The hidden state the first block reads: the token embeddings.
  if not rawget(cls, 'embed') then
    -- model:embed(ids) -> the hidden state the first block reads: the token embeddings
    cls.embed = function(self, ids) return self[names.embed](ids) end
  end
  -- The head applied to a hidden state (B, T, C): the logit lens.
  cls.readout = function(self, h)
    h = self[names.norm](h)
    local head = self[names.head]
    if head then return head(h) end
    return nn.functional.linear(h, self[names.embed].weight)
  end
  -- model:unembedding() -> the head's weight (V x C): the checkpoint's
  -- lm_head, or the token embedding where the head is tied to it
  cls.unembedding = function(self)
    local head = self[names.head]
    return head and head.weight or self[names.embed].weight
  end
  -- model:hidden_from(i, h) -> (B, T, C): layers i..N run from h, the
  -- hidden state layer i reads (i = N + 1: h itself); what readout reads.
  -- The model protocol's optional shortcut, for a model whose forward is
  -- readout(hidden_from(1, embed(ids))): the autopsy's removal sweep then
  -- reruns only the layers after the one it removes.
  cls.hidden_from = function(self, i, x)
    local stack = self[names.stack]
    for k = i, #stack do x = stack[k](x) end
    return x
  end
  -- ids (B, T) int64, 1-based -> logits (B, T, V)
  cls.forward = function(self, ids)
    models.check_ids(self, ids)
    local y = self:readout(self:hidden_from(1, self:embed(ids)))
    return y
  end
  -- model:context() -> the longest input it takes (the checkpoint's positions)
  cls.context = function(self) return self.config.positions end
end

-- family.model(class, Norm, Block, names[, hf]) -> a family's decoder class,
-- nn.block(class), set as models.<its name> (models.Llama): its modules
-- family.decoder_parts(self, s, Norm, Block) (Block: the block class, or a
-- function of the settings that returns one), its methods family.decoder(cls,
-- names), cached generation on (incremental: the attention keeps its keys and
-- values and counts the positions). hf: the stack's Hugging Face name, {stack =
-- 'model.layers'} (models.hf_name: blocks.1 is model.layers.0), or the prefix
-- of its names, {prefix = 'transformer.'} (GPT-2's h.1 is transformer.h.0).
function family.model(class, Norm, Block, names, hf)
  local cls = nn.block(class, function(self, s)
    family.decoder_parts(self, s, Norm, type(Block) == 'function' and Block(s) or Block)
  end)
  models[class:match('^models%.(.+)$')] = cls
  family.decoder(cls, names)
  cls.incremental = true
  if hf and hf.stack then cls.hf_stack = {names.stack, hf.stack} end
  if hf and hf.prefix then cls.hf_prefix = hf.prefix end
  return cls
end

-- family.size_keys(...) -> the config keys a Llama-like decoder's size comes from (F.size_keys,
-- which pretrained.check_size names in its error), then the family's own (...)
function family.size_keys(...)
  local keys = {'num_hidden_layers', 'hidden_size', 'intermediate_size', 'num_attention_heads', 'num_key_value_heads',
    'head_dim', 'vocab_size'}
  for _, k in ipairs{...} do keys[#keys + 1] = k end
  return keys
end

-- family.widths(s) -> q, kv, hd: the widths of the queries and of each of the keys and values
-- (s.heads and s.kv_heads times the head size), and the head size (s.head_dim, or s.dim / s.heads)
function family.widths(s)
  local hd = s.head_dim or math.floor(s.dim / s.heads)
  return s.heads * hd, s.kv_heads * hd, hd
end

-- family.decoder_parts(model, s, Norm, Block): a decoder's modules, in the
-- order of its class's names (family.decoder): the token embedding (s.vocab x
-- s.dim), GPT-2's learned positions where the names have them, s.layers
-- Block(s, i) in a ModuleList, the final Norm(s.dim, {eps = s.eps}) and, unless
-- s.tied, the head (with a bias where s.head_bias: Phi's). The model keeps s as its config.
function family.decoder_parts(model, s, Norm, Block)
  local names = model.pretrained_names
  rawset(model, 'config', s)
  model[names.embed] = nn.Embedding(s.vocab, s.dim)
  if names.positions then model[names.positions] = nn.Embedding(s.positions, s.dim) end
  local blocks = {}
  for i = 1, s.layers do blocks[i] = Block(s, i) end
  model[names.stack] = nn.ModuleList(blocks)
  model[names.norm] = Norm(s.dim, {eps = s.eps})
  if not s.tied then model[names.head] = nn.Linear(s.dim, s.vocab, {bias = s.head_bias == true}) end
end

-- The dropout a checkpoint's config.json asks for ({'attn_pdrop=0.1', ...},
-- the non-zero ones): anatomy does not apply it (in train mode either, where
-- transformers would); print(model) says so beside the rest of its config.
function family.dropout_settings(c)
  local out = {}
  for k, v in pairs(c) do
    if type(k) == 'string' and type(v) == 'number' and v > 0 and (k:find('drop') or k:find('pdrop')) then
      out[#out + 1] = ('%s=%g'):format(k, v)
    end
  end
  table.sort(out)
  return out
end

-- What print(model) adds to a checkpoint's settings: ', weights processed
-- (fold_ln, ...)' where models.process_weights ran, ', dropout of the
-- checkpoint not applied (attn_pdrop=0.1, ...)' where it has some; or ''.
function family.config_note(model)
  local processed = process.describe(model)
  local note = processed and (', weights processed (%s)'):format(processed) or ''
  local d = rawget(model, 'hf_dropout')
  if type(d) ~= 'table' or #d == 0 then return note end
  return note .. (', dropout of the checkpoint not applied (%s): anatomy runs it without dropout, in train mode too'):format(table.concat(d, ', '))
end

-- config.json's number `key`, or an error naming it and the family.
function family.need(c, key, where)
  if type(c[key]) ~= 'number' then error(('%s: config.json needs a number %s (%s)'):format(where, key, tostring(c.model_type)), 0) end
  return c[key]
end

-- config.json's dimension `key` (a size, a count of layers or heads): a
-- whole number from 1 to 2^31, or an error naming the key and its value. An
-- optional one may be absent (or null): nil then.
function family.dim(c, key, where, optional)
  local v = c[key]
  if optional and (v == nil or v == json.null) then return nil end
  if type(v) ~= 'number' then return family.need(c, key, where) end
  if v ~= v or v < 1 or v > 2^31 or v ~= math.floor(v) then
    error(('%s: config.json has %s = %s, which is not a dimension (a whole number from 1 to 2^31)'):format(
      where, key, tostring(v)), 0)
  end
  return v
end

-- Hugging Face's activation names -> nn.MLP's.
family.activations = {gelu_new = 'gelu_tanh', gelu_pytorch_tanh = 'gelu_tanh', gelu = 'gelu', relu = 'relu'}

-- The config's value of `key` checked against what anatomy does: `ok(value)`
-- true, else an error naming the key and its value.
function family.refuse(where, key, value, why)
  error(('%s: config.json has %s = %s, which anatomy does not support (%s)'):format(
    where, key, json.encode(value), why), 0)
end

-- RoPE's settings from either config form: the Hub's (rope_theta and
-- rope_scaling; GPT-NeoX's rotary_emb_base and rotary_pct) or transformers
-- 5's (rope_parameters).
function family.rope(c, where)
  local p = type(c.rope_parameters) == 'table' and c.rope_parameters or c.rope_scaling
  local r = {theta = (type(c.rope_parameters) == 'table' and c.rope_parameters.rope_theta) or c.rope_theta
    or c.rotary_emb_base or 10000, scaling = 'default',
    -- the share of each head that rotates (GPT-NeoX's rotary_pct)
    partial = (type(c.rope_parameters) == 'table' and c.rope_parameters.partial_rotary_factor) or c.rotary_pct or 1}
  if type(p) == 'table' then
    local kind = p.rope_type or p.type or 'default'
    local key = type(c.rope_parameters) == 'table' and 'rope_parameters.rope_type' or 'rope_scaling.type'
    if kind == 'linear' then
      r.scaling, r.factor = 'linear', p.factor
    elseif kind == 'llama3' then
      r.scaling, r.factor = 'llama3', p.factor
      r.low_freq_factor, r.high_freq_factor = p.low_freq_factor, p.high_freq_factor
      r.original_max_positions = p.original_max_position_embeddings
    elseif kind ~= 'default' then
      family.refuse(where, key, kind, 'supported: default, linear, llama3')
    end
  end
  return r
end

-- nn.RoPEAttention's options: the RoPE settings family.rope read, and a
-- family's own (kv_heads, biases, rotary_dim, sliding_window).
local rope_keys = {'theta', 'scaling', 'factor', 'low_freq_factor', 'high_freq_factor', 'original_max_positions'}
-- pretrained.attention_options(rope, own) -> nn.RoPEAttention's options table: the RoPE settings and the family's own
function family.attention_options(rope, own)
  local o = {}
  for _, k in ipairs(rope_keys) do o[k] = rope[k] end
  for k, v in pairs(own) do o[k] = v end
  return o
end

return family
