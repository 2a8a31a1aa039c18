// libFuzzer: the readers written in Lua, run in anatomy's own Lua state: the
// JSON decoder (config.json, tokenizer_config.json, metrics lines), a
// Hugging Face folder whose config.json is the input (models.from_pretrained
// up to its first check that fails), the script --key=value parser
// (torch.config.parse) on the input split into arguments, and the metrics
// JSON-lines reader. Each must return or raise a Lua error with a message;
// an error without one, or any crash, is a finding.
#include "host/lua/state.h"
#include "tests/fuzz/fuzz_common.h"

#include <lua.hpp>

#include <cstdlib>
#include <memory>

namespace {
const char* kHarness = R"LUA(
local json = require 'anatomy.json'
local fs = require 'anatomy.fs'
return function(text, path, folder)
  local function check(ok, err)
    if not ok and (type(err) ~= 'string' or err == '') then error('FINDING: an error without a message: ' .. tostring(err)) end
  end
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

struct Harness {
  std::unique_ptr<anatomy::LuaState> state;
  std::string folder;
  Harness() {
    anatomy::RuntimeOptions options;
    options.threads = 1;
    state = std::make_unique<anatomy::LuaState>(options);
    lua_State* L = state->get();
    if (luaL_loadstring(L, kHarness) != 0 || lua_pcall(L, 0, 1, 0) != 0) std::abort();
    lua_setglobal(L, "__fuzz_harness");
    folder = anatomy::fuzz::as_file(nullptr, 0, ".folder");
    std::remove(folder.c_str());
    std::string mk = "mkdir -p '" + folder + "'";
    if (std::system(mk.c_str()) != 0) std::abort();
  }
};
}  // namespace

Harness* harness = nullptr;

// The Lua state is made once, before the first input (its start-up would
// count against the first input's time limit).
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  harness = new Harness();
  // one input first, so that the modules the readers load on first use are
  // loaded before the clock starts
  const char warm[] = R"({"model_type": "gpt2", "vocab_size": 4, "n_positions": 4, "n_embd": 4, "n_layer": 1, "n_head": 1})";
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(warm), sizeof warm - 1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Harness& h = *harness;
  std::string path = anatomy::fuzz::as_file(data, size, ".jsonl");
  lua_State* L = h.state->get();
  lua_getglobal(L, "__fuzz_harness");
  lua_pushlstring(L, reinterpret_cast<const char*>(data), size);
  lua_pushstring(L, path.c_str());
  lua_pushstring(L, h.folder.c_str());
  if (!h.state->call(3, 0)) {
    std::fprintf(stderr, "%s\n", h.state->error().c_str());
    std::abort();
  }
  lua_settop(L, 0);
  return 0;
}
