// libFuzzer: the readers written in Lua, run in anatomy's own Lua state: the
// JSON decoder (config.json, tokenizer_config.json, metrics lines), a
// Hugging Face folder whose config.json is the input (models.from_pretrained
// up to its first check that fails), the script --key=value parser
// (torch.config.parse) on the input split into arguments, and the metrics
// JSON-lines reader. Each must return or raise a Lua error with a message;
// an error without one, or any crash, is a finding.
#include "tests/fuzz/fuzz_lua.h"

namespace {
const char* kHarness = R"LUA(
local json = require 'anatomy.io.json'
return function(text, path, folder)
  local check = __fuzz_check
  check(pcall(json.decode, text))
  -- a model folder whose config.json is the input
  local f = assert(io.open(folder .. '/config.json', 'wb')); f:write(text); f:close()
  check(pcall(models.from_pretrained, folder))
  -- the input as command-line arguments of a script
  local args = {}
  for a in text:gmatch('[^\n]+') do args[#args + 1] = a end
  check(pcall(torch.config.parse, {steps = 10, lr = 0.001, name = 'x', flag = false}, args))
  -- the input as a metrics file
  check(pcall(train.read_metrics, path))
end
)LUA";
anatomy::fuzz::LuaHarness* harness = nullptr;
}  // namespace

// The Lua state is made once, before the first input (its start-up would
// count against the first input's time limit), and one input runs first, so
// that the modules the readers load on first use are loaded before the clock starts.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  harness = new anatomy::fuzz::LuaHarness(kHarness, ".jsonl");
  harness->run(R"({"model_type": "gpt2", "vocab_size": 4, "n_positions": 4, "n_embd": 4, "n_layer": 1, "n_head": 1})");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  harness->run(data, size);
  return 0;
}
