// libFuzzer: the checkpoint reader (train.load_checkpoint, lua/anatomy/train.lua):
// the input as a checkpoint of a small GPT and its AdamW state, loaded into
// the model, the optimizer and the random generator, then one forward pass,
// one optimizer step and one random draw. It loads or raises a Lua error
// with a message; a crash (a generator state of the wrong size, an optimizer
// state of the wrong shape) is a finding.
#include "tests/fuzz/fuzz_lua.h"

namespace {
const char* kHarness = R"LUA(
torch.manual_seed(0)
local model = models.gpt{vocab = 8, dim = 8, heads = 2, layers = 1, seq = 4, ffn = 8}
local opt = optim.AdamW(model:parameters(), {lr = 1e-3})
local x = torch.tensor({{1, 2, 3, 4}}, {dtype = 'int64'})
return function(text, path)
  local ok, err = pcall(train.load_checkpoint, path, model, opt)
  __fuzz_check(ok, err)
  if ok then
    local loss = model(x):sum()
    opt:zero_grad()
    loss:backward()
    __fuzz_check(pcall(opt.step, opt))
    torch.rand(2)
  end
end
)LUA";
anatomy::fuzz::LuaHarness* harness = nullptr;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  harness = new anatomy::fuzz::LuaHarness(kHarness, ".ckpt");
  harness->run("not a checkpoint");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  harness->run(data, size);
  return 0;
}
