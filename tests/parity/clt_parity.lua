-- The anatomy side of test_clt_parity.py: reads every circuit-tracer folder
-- or Hub reference named on the command line (sae.load_clt) and writes its features and every
-- layer's reconstruction of the same MLP inputs; trains a cross-layer
-- transcoder (JumpReLU) and a per-layer set with skip (ReLU) on a tiny model
-- for a few steps, saves both in circuit-tracer's format, and writes their
-- own features and reconstructions of the MLP inputs of the model's forward.
--   anatomy clt_parity.lua ACTS OUT_DIR FOLDER...
local acts_path, out_dir = arg[1], arg[2]
local x = torch.load_safetensors(acts_path).x  -- (N, L, D)
local results = {}
for i = 3, #arg do
  local c = sae.load_clt(arg[i])
  local f = c:encode(x)
  results['read_' .. (i - 2) .. '_acts'] = f
  results['read_' .. (i - 2) .. '_recons'] = c:decode(f, x)
  print(('read %s: %s, hooks %s -> %s'):format(arg[i], tostring(c), c.cfg.input_hook, c.cfg.output_hook))
end
torch.manual_seed(3)
local corpus = data.from_string(('the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs. '):rep(40))
local model = models.gpt{vocab = corpus.vocab_size, dim = 16, heads = 2, layers = 3, seq = 16, ffn = 32}
model:eval()
-- the MLP inputs (N, L, D) of one forward: what the trained transcoders are compared on
local ids = corpus:tokens('val'):narrow(1, 1, 48):view(3, 16)
local inputs, handles = {}, {}
for l = 1, 3 do
  handles[l] = probe.replace(model, 'blocks.' .. l .. '.mlp', function(_, _, input) inputs[l] = input:reshape({-1, 16}) end)
end
model(ids)
probe.group(handles):remove()
local mlp_in = torch.stack(inputs, 2)
results.trained_x = mlp_in
local base = {width = 24, steps = 20, batch = 64, seq = 16, sequences = 4, quiet = true, warmup = 2}
for name, extra in pairs{clt = {kind = 'jumprelu'}, set = {kind = 'relu', cross_layer = false, skip = true}} do
  local opts = {}
  for k, v in pairs(base) do opts[k] = v end
  for k, v in pairs(extra) do opts[k] = v end
  local c, history = sae.train_clt(model, corpus, opts)
  print(('trained %s: %s, loss %.4f -> %.4f'):format(name, tostring(c), history.loss[1], history.loss[#history.loss]))
  c:save(out_dir .. '/' .. name)
  local f = c:encode(mlp_in)
  results['trained_' .. name .. '_acts'] = f
  results['trained_' .. name .. '_recons'] = c:decode(f, mlp_in)
end
torch.save_safetensors(out_dir .. '/anatomy.safetensors', results)
