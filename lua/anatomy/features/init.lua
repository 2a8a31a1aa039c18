-- sae: sparse autoencoders and transcoders over a model's activations. Its
-- parts, each in its own file:
--   SAE.lua        the autoencoder: encode, decode, its kinds
--   store.lua      activations streamed from a model, shuffled, cached on disk
--   train.lua      training: the losses, dead features, the auxiliary-k loss
--   saelens.lua    SAELens's folder format, read and written
--   splice.lua     sae.attach (the reconstruction in the model) and sae.evaluate
--   inspect.lua    top-activating contexts, feature pages
--   CLT.lua        cross-layer and per-layer transcoders (circuit-tracer's); clt.lua, clt_files.lua, clt_splice.lua
local torch = require('anatomy.torch')
local options = require('anatomy.torch.options')
local nn = require('anatomy.nn')
local SAE = require('anatomy.features.SAE')
local saelens = require('anatomy.features.saelens')
local training = require('anatomy.features.train')
local points = require('anatomy.probe.points')
local splice = require('anatomy.features.splice')
local inspect = require('anatomy.features.inspect')
local by_release = require('anatomy.features.by_release')
local CLT = require('anatomy.features.CLT')
local clt = require('anatomy.features.clt')
local clt_splice = require('anatomy.features.clt_splice')
local sae = {SAE = SAE, CLT = CLT, evaluate = splice.evaluate, top_activations = inspect.top_activations}

-- sae.attach(model, s, {error_term = false, point}) -> handle: an SAE at
-- its point (features/splice.lua). For a sae.CLT ({error_term} only): every
-- layer's MLP output is replaced by the decoding of the features of that
-- layer and the earlier ones (the reconstruction ŷ_m); with error_term =
-- true by ŷ_m + (y_m − ŷ_m), the clean logits exactly while nothing changes
-- the features. Layer m's features and error are the hook points
-- '<output>.clt.acts' (B, T, F) and '<output>.clt.error' (B, T, D), where
-- <output> is its MLP's output ('blocks.2.mlp'). handle:remove() or
-- probe.clear(model) takes the splice out.
function sae.attach(model, s, opts)
  if nn.is_instance(s, CLT) then return clt_splice.attach(model, s, opts, 'sae.attach') end
  return splice.attach(model, s, opts)
end

-- cross-layer transcoders and per-layer sets (features/clt.lua)
sae.clt, sae.load_clt, sae.train_clt = clt.new, clt.load, clt.train

sae.from_pretrained = by_release.from_pretrained

-- attribution graphs, as circuit-tracer's attribute (features/graph.lua)
sae.attribute = require('anatomy.features.graph').attribute
sae.Graph = require('anatomy.features.Graph')
local graph_prune = require('anatomy.features.graph_prune')
sae.prune_graph, sae.graph_scores = graph_prune.prune_graph, graph_prune.graph_scores
sae.intervene = require('anatomy.features.graph_intervene').intervene  -- circuit-tracer's feature_intervention

local function check_cfg(cfg, where)
  cfg = options.check(cfg, {'d_in', 'd_sae', 'kind', 'k', 'point', 'model_name', 'apply_b_dec_to_input', 'threshold',
    'hook_name', 'transcoder', 'bandwidth', 'd_out', 'skip', 'hook_name_out'}, where, 3)
  local c = {}
  for k, v in pairs(cfg) do c[k] = v end
  c.d_in = options.whole(cfg.d_in, 'd_in', where, nil)
  c.d_sae = options.whole(cfg.d_sae, 'd_sae', where, nil)
  if not c.d_in or not c.d_sae then error(('%s: d_in and d_sae are needed (the point\'s width and the number of features)'):format(where), 3) end
  c.kind = cfg.kind or 'topk'
  if not SAE.kinds[c.kind] then
    error(("%s: kind must be 'topk', 'relu', 'jumprelu' or 'batchtopk', got %s"):format(where, tostring(cfg.kind)), 3)
  end
  if c.kind == 'topk' or c.kind == 'batchtopk' then
    c.k = options.whole(cfg.k, 'k', where, math.min(32, c.d_sae))
    if c.k > c.d_sae then error(('%s: k must be at most d_sae %d, got %d'):format(where, c.d_sae, c.k), 3) end
  end
  if c.apply_b_dec_to_input == nil then c.apply_b_dec_to_input = true end
  return c
end

-- sae.new{d_in, d_sae, kind = 'topk'|'relu'|'jumprelu'|'batchtopk', k = 32,
-- point, apply_b_dec_to_input = true} -> an untrained SAE (decoder rows random
-- unit vectors, the encoder their transpose, biases zero)
function sae.new(cfg)
  return SAE(check_cfg(cfg, 'sae.new'))
end

-- The SAE sae.train starts from, its cfg from the training options, on the model's device.
function SAE._trained(o, D, point, model)
  -- a transcoder's b_dec lies in the output's space: not subtracted from the input
  return SAE({d_in = D, d_sae = o.width, kind = o.kind, k = o.k, point = point, apply_b_dec_to_input = not o.transcoder,
    transcoder = o.transcoder or nil, model_name = model.config and model.config.name_or_path or nil,
    hook_name = points.to_transformer_lens(model, point)}, model:device())
end

-- sae.load(folder) -> an SAE from SAELens's format (cfg.json and
-- sae_weights.safetensors; 'standard', 'topk' and 'jumprelu'). Its point is
-- cfg.json's hook name (anatomy's own when anatomy wrote it; a
-- TransformerLens name otherwise, which sae.attach translates).
function sae.load(folder)
  local where = 'sae.load'
  if type(folder) ~= 'string' then error(('%s: folder must be a string, got %s'):format(where, type(folder)), 2) end
  local cfg, raw = saelens.read_config(folder, where)
  local tensors = saelens.read_weights(folder, cfg, where)
  local meta = type(raw.metadata) == 'table' and raw.metadata or {}
  cfg.point = type(meta.anatomy_point) == 'string' and meta.anatomy_point
    or saelens.transcoder_point(cfg.hook_name, cfg.hook_name_out) or cfg.hook_name
  cfg.transcoder = cfg.transcoder or meta.transcoder == true or nil
  local s = SAE(cfg)
  torch.no_grad(function()
    for _, name in ipairs{'W_enc', 'b_enc', 'W_dec', 'b_dec', 'threshold', 'W_skip'} do
      if tensors[name] and s[name] then s[name]:copy_(tensors[name]:float()) end
    end
  end)
  return s
end

-- s:save(folder, {model}) -> folder: the SAE in SAELens's format (cfg.json
-- and sae_weights.safetensors, float32), which SAELens's SAE.load_from_disk
-- reads; a BatchTopK SAE is written as the JumpReLU it computes after
-- training. cfg.json's hook_name is TransformerLens's name of the point
-- ('blocks.0.hook_resid_post'), as SAELens and TransformerLens attach it,
-- where it is known (sae.train and sae.attach learn it from the model; so
-- does {model = ...} here); anatomy's own name is metadata.anatomy_point,
-- and sae.load reads either.
function SAE:save(folder, opts)
  if type(folder) ~= 'string' or folder == '' then error(('sae:save: folder must be a string, got %s'):format(tostring(folder)), 2) end
  opts = options.check(opts, {'model'}, 'sae:save', 2)
  if opts.model ~= nil then
    if not nn.is_module(opts.model) then error(('sae:save: model must be a model, got %s'):format(type(opts.model)), 2) end
    local name = self.cfg.point and points.canonical(opts.model, self.cfg.point)
    if not name then error(("sae:save: the SAE's point '%s' is no point of the model"):format(tostring(self.cfg.point)), 2) end
    self.cfg.hook_name = points.to_transformer_lens(opts.model, name) or self.cfg.hook_name
  end
  saelens.write(self, folder)
  return folder
end

-- sae.train(model, corpus, {point, width = 8·D, kind = 'topk', k = 32, l1,
-- l0, steps = 2000, batch = 1024 rows, lr = 1e-3, seq, sequences = 32,
-- buffer = 16·batch, seed = 1, dead_after, k_aux = D/2, aux_coefficient =
-- 1/32, transcoder = false, cache, log_every, warmup, bandwidth = 0.001,
-- checkpoint, checkpoint_every = log_every, resume, quiet = false}) -> s, history.
-- point: where the activations are read ('blocks.3.resid_post', a hook point
-- or a module's output); with transcoder = true, a module ('blocks.3.mlp')
-- whose input the SAE encodes and whose output it reconstructs. cache: a
-- folder for the activations as safetensors shards, reused by the next
-- run on the same model, point and text. l1 (relu) and l0 (jumprelu) weigh
-- the sparsity penalty; bandwidth is the JumpReLU's straight-through width
-- in units of the activations' standard deviation; warmup: steps of linear
-- learning-rate warm-up (default min(100, steps/10)). checkpoint: a file
-- written every checkpoint_every steps; resume: such a file, from which the
-- run ends with the weights of one that was never stopped. history: step,
-- loss, l0, explained_variance, dead per logged step. Every option is
-- checked before the model runs; the same seed gives the same SAE.
function sae.train(model, corpus, opts)
  local where = 'sae.train'
  if not nn.is_module(model) then error(('%s: model must be a model, got %s'):format(where, type(model)), 2) end
  if corpus == nil or (type(corpus) ~= 'table' and type(corpus) ~= 'userdata') or not corpus.batch then
    error(('%s: corpus must be a data.Corpus, got %s'):format(where, type(corpus)), 2)
  end
  options.check(opts, training.allowed, where, 2)
  local given = opts or {}
  opts = {}
  for k, v in pairs(given) do opts[k] = v end
  if type(opts.point) ~= 'string' then error(("%s: point must name where to read ('blocks.3.resid_post'), got %s"):format(
    where, tostring(opts.point)), 2) end
  local canonical, why = points.canonical(model, opts.point)
  if not canonical then error(('%s: point: %s'):format(where, why), 2) end
  opts.point = canonical
  if opts.transcoder then
    local ok, _, _, hook = pcall(points.locate, model, canonical, 1)
    if ok and hook then error(("%s: a transcoder reads a module's input and output; '%s' is a hook point"):format(where, canonical), 2) end
  end
  return training.train(model, corpus, opts, where)
end

return sae
