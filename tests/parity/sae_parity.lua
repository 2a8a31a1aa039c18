-- The anatomy side of test_sae_parity.py: reads every SAELens folder named
-- on the command line and writes its features and reconstruction of the
-- same activations; writes SAEs of every kind (random, trained-looking
-- weights) in SAELens's format, with their own features and reconstructions.
--   anatomy sae_parity.lua ACTS OUT_DIR FOLDER...
local acts_path, out_dir = arg[1], arg[2]
local x = torch.load_safetensors(acts_path).x  -- (N, D)
local results = {}
for i = 3, #arg do
  local s = sae.load(arg[i])
  local f = s:encode(x)
  results['read_' .. (i - 2) .. '_acts'] = f
  results['read_' .. (i - 2) .. '_recons'] = s:decode(f)
end
torch.manual_seed(7)
local D = x:size(2)
for _, kind in ipairs{'relu', 'topk', 'jumprelu', 'batchtopk'} do
  local s = sae.new{d_in = D, d_sae = 48, kind = kind, k = (kind == 'topk' or kind == 'batchtopk') and 6 or nil,
    point = 'blocks.2.resid_post'}
  torch.no_grad(function()
    s.W_enc:copy_(torch.randn(D, 48) * 0.3)
    s.b_enc:copy_(torch.randn(48) * 0.2)
    s.b_dec:copy_(torch.randn(D) * 0.1)
    if s.threshold then s.threshold:copy_(torch.rand(48) * 0.5) end
  end)
  s:save(out_dir .. '/' .. kind)
  local f = s:encode(x)
  results['written_' .. kind .. '_acts'] = f
  results['written_' .. kind .. '_recons'] = s:decode(f)
end
torch.save_safetensors(out_dir .. '/anatomy.safetensors', results)
