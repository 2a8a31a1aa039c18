// The random generator's state as a tensor: torch.get_rng_state and
// torch.set_rng_state (checkpoints resume exactly with them).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "bindings/parts.h"
#include "bindings/common.h"

#include <mutex>

namespace anatomy::lua {
namespace {

// The default generator of the device named at index idx (the CPU's when absent)
at::Generator generator_at(lua_State* L, int idx) {
  if (lua_isnoneornil(L, idx)) return at::detail::getDefaultCPUGenerator();
  c10::Device device = parse_device_arg(luaL_checkstring(L, idx), idx);
  return at::globalContext().defaultGenerator(device);
}

// torch.get_rng_state([device]) -> uint8 tensor: the generator's state
// (PyTorch's layout): the CPU's, or with a device that device's own (CUDA's
// as torch.cuda.get_rng_state returns it): what is drawn on a GPU comes from
// its generator, not the CPU's
int torch_get_rng_state(lua_State* L) {
  auto gen = generator_at(L, 1);
  std::lock_guard<std::mutex> lock(gen.mutex());
  push_tensor(L, gen.get_state());
  return 1;
}

// torch.set_rng_state(state [, device]): restores what get_rng_state returned
int torch_set_rng_state(lua_State* L) {
  at::Tensor& state = check_tensor(L, 1);
  if (state.scalar_type() != at::kByte || state.dim() != 1)
    throw ArgError(1, "expected the uint8 tensor that get_rng_state returns");
  auto gen = generator_at(L, 2);
  std::lock_guard<std::mutex> lock(gen.mutex());
  try {
    gen.set_state(state.cpu());
  } catch (const c10::Error& e) {
    throw ArgError(1, "not a generator state (" + std::string(e.what_without_backtrace()).substr(0, 80) + ")");
  }
  return 0;
}

const luaL_Reg functions[] = {
    {"get_rng_state", guarded<torch_get_rng_state>},
    {"set_rng_state", guarded<torch_set_rng_state>},
    {nullptr, nullptr},
};

}  // namespace

/// Adds get_rng_state and set_rng_state to the torch table at index torch.
void register_random(lua_State* L, int torch) {
  lua_pushvalue(L, torch);
  luaL_register(L, nullptr, functions);
  lua_pop(L, 1);
}

}  // namespace anatomy::lua
