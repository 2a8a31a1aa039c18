-- probe: the interpretability layer. Every module output is a probe point
-- named by its dotted path ('blocks.3', 'blocks.3.inner.attn'), and so is
-- every hook point inside a block ('blocks.3.attn.q', 'blocks.3.attn.pattern',
-- 'blocks.3.mlp.post', 'blocks.3.resid_mid', 'ln_f.scale'): what a block
-- passes through self:hook(name, t) (nn.Module), the built-in blocks from C++
-- (their m:hook_points()). Probes record activations (and their gradients),
-- replace them (ablation, patching, a set value; one head or one position),
-- or skip a block (removal). Its parts, each in its own file:
--   points.lua         names: globs, checkpoint and TransformerLens spellings, where a name lives
--   hooks.lua          the one attach mechanism, handles, capture, clear
--   inputs.lua         ids from texts, token ids, positions from either end
--   cache.lua          run_with_cache and the Cache it returns
--   interventions.lua  ablate, set, patch
--   attribution.lua    direct logit attribution
--   patching.lua       activation patching over layers, heads, positions; path patching
--   runs.lua           what the patching calls share: id pairs, points per layer, metrics, the grid Result
--   attribute.lua      patching estimated from gradients: AtP, AtP*, integrated gradients
--   edges.lua          edge attribution (EAP, EAP-IG): a graph of scored edges between components
--   prompt.lua         test_prompt: a prompt's answer, its rank and probability
--   steer.lua          steering vectors
--   lens.lua           the logit lens and the tuned lens: each layer's prediction
--   linear.lua         linear probes per layer, with control tasks
--   detect.lua         head detectors: previous-token, duplicate-token, induction
local points = require('anatomy.probe.points')
local hooks = require('anatomy.probe.hooks')
local inputs = require('anatomy.probe.inputs')
local Cache = require('anatomy.probe.cache')
local interventions = require('anatomy.probe.interventions')
local attribution = require('anatomy.probe.attribution')
local prompt = require('anatomy.probe.prompt')
require('anatomy.probe.generate')  -- m:generate and corpus:sample

local probe = {
  -- names (points.lua)
  names = points.names,
  matcher = points.matcher,
  resolve_name = points.resolve_name,
  canonical = points.canonical,
  from_transformer_lens = points.from_transformer_lens,
  transformer_lens_names = points.transformer_lens_names,
  to_transformer_lens = points.to_transformer_lens,
  checkpoint_spelling = points.checkpoint_spelling,
  layout = points.layout,
  -- attaching and removing (hooks.lua)
  replace = hooks.replace,
  skip = hooks.skip,
  idle = hooks.idle,
  watch = hooks.watch,
  group = hooks.group,
  clear = hooks.clear,
  attach_capture = hooks.attach_capture,
  with = hooks.with,
  scope = require('anatomy.probe.scope').run,
  require_clean = hooks.require_clean,
  analysis = hooks.analysis,
  list = hooks.list,
  capture = hooks.capture,
  -- inputs (inputs.lua)
  to_ids = inputs.public_to_ids,
  forward = inputs.forward,
  -- the cache (cache.lua)
  run_with_cache = Cache.run_with_cache,
  run_with_hooks = Cache.run_with_hooks,
  Cache = Cache,
  -- interventions (interventions.lua)
  ablate = interventions.ablate,
  set = interventions.set,
  patch = interventions.patch,
  -- attribution (attribution.lua)
  logit_attribution = attribution.run,
  -- a prompt and its answer (prompt.lua)
  test_prompt = prompt.test_prompt,
  -- head detectors (detect.lua)
  detect_heads = require('anatomy.probe.detect').heads,
  -- linear probes (linear.lua)
  linear = require('anatomy.probe.linear').probe,
}

return probe
