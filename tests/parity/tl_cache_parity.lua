-- The anatomy side of test_tl_cache_parity.py: the cache methods
-- TransformerLens users reach for, tok:to_str_tokens and probe.test_prompt
-- on a GPT-2 folder. arg: folder, ids.safetensors, text, answer, out.safetensors
local folder, ids_path, text, answer, out_path = arg[1], arg[2], arg[3], arg[4], arg[5]
local json = require('anatomy.io.json')
local model, tok = models.from_pretrained(folder)
local ids = torch.load_safetensors(ids_path).ids
local _, cache = probe.run_with_cache(model, ids, {filter = {'*', '*.result'}})
local out, labels = {}, {}
local function keep(name, t, l) out[name] = t:contiguous(); labels[name] = l end
keep('accumulated_final_ln', cache:accumulated_resid({apply_ln = true}))
keep('accumulated_2_mid_ln', cache:accumulated_resid({layer = 2, incl_mid = true, apply_ln = true}))
keep('accumulated_2_mlp_input', cache:accumulated_resid({layer = 2, mlp_input = true}))
keep('decompose', cache:decompose_resid())
keep('decompose_ln', cache:decompose_resid({apply_ln = true}))
keep('decompose_2_mlp_ln', cache:decompose_resid({layer = 2, mlp_input = true, apply_ln = true}))
keep('heads', cache:stack_head_results())
keep('heads_ln', cache:stack_head_results({apply_ln = true}))
-- the head detectors on the texts TransformerLens scored, given as its ids (BOS first), padded on the right
local inputs = torch.load_safetensors(ids_path)
local texts = {}
for i = 1, 10 do texts[i] = inputs['detect_ids_' .. i] end
local variants = {plain = {}, no_bos = {exclude_bos = true}, no_current = {exclude_current_token = true},
  no_both = {exclude_bos = true, exclude_current_token = true}}
for variant, opts in pairs(variants) do
  opts.baseline = false
  local s = probe.detect_heads(model, texts, {'previous_token', 'duplicate_token', 'induction'}, opts)
  for kind, scores in pairs(s) do keep(('detect_%s_%s'):format(kind, variant), torch.tensor(scores.scores, {dtype = 'float64'})) end
end
local r = probe.test_prompt(model, text, answer, {top_k = 3, quiet = true})
local ranks = {}
for i, a in ipairs(r.answers) do ranks[i] = {a.token, a.rank, a.logit, a.prob} end
torch.save_safetensors(out_path, out, {labels = json.encode(labels), str_tokens = json.encode(tok:to_str_tokens(text)),
  ranks = json.encode(ranks)})
