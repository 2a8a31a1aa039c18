-- The anatomy side of test_graph_intervene_parity.py: loads the tiny model
-- folders written by transformers and the transcoders written by
-- circuit-tracer, runs each case's interventions with sae.intervene and
-- writes its logits (T, V) and activations (L, T, F).
--   anatomy graph_intervene_parity.lua OUT IDS CASES_LUA
-- CASES_LUA returns {{key, model, clt, input_hook, output_hook, interventions, opts}, ...}, every index from 1.
local out = arg[1]
local ids = {}
for id in arg[2]:gmatch('%d+') do ids[#ids + 1] = tonumber(id) end
local cases = dofile(arg[3])
local models_, clts, results = {}, {}, {}
for _, case in ipairs(cases) do
  local model = models_[case.model]
  if not model then
    model = models.from_pretrained(case.model)
    model:eval()
    models_[case.model] = model
  end
  local key = case.clt .. '|' .. case.input_hook .. '|' .. case.output_hook
  local c = clts[key]
  if not c then
    c = sae.load_clt(case.clt, {input_hook = case.input_hook, output_hook = case.output_hook})
    clts[key] = c
  end
  local r = sae.intervene(model, c, ids, case.interventions, case.opts)
  results[case.key .. '.logits'] = r.logits
  results[case.key .. '.activations'] = r.activations
end
print(('%d interventions run'):format(#cases))
torch.save_safetensors(out, results)
