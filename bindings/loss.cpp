// The cross-entropy behind nn.functional.cross_entropy, with 1-based targets.
#include <ATen/ATen.h>

#include "bindings/parts.h"
#include "bindings/common.h"
#include "host/tensor_format.h"

namespace anatomy::lua {
namespace {

// _cross_entropy(logits (..., V), targets (...) int64, 1-based) -> mean loss
int torch_cross_entropy(lua_State* L) {
  at::Tensor& logits = check_tensor(L, 1);
  at::Tensor& targets = check_tensor(L, 2);
  if (logits.dim() < 1) throw ArgError(1, "logits need a class dimension");
  if (targets.scalar_type() != at::kLong)
    throw ArgError(2, std::string("targets must be int64 class ids, got ") + dtype_name(targets.scalar_type()));
  std::vector<int64_t> lead(logits.sizes().begin(), logits.sizes().end() - 1);
  if (!targets.sizes().equals(lead))
    throw ArgError(2, "targets have shape " + shape_string(targets.sizes()) + ", expected " + shape_string(lead) +
                          " for logits of shape " + shape_string(logits.sizes()));
  int64_t V = logits.size(-1);
  at::Tensor t0 = zero_based_index(targets, V, 2);
  push_tensor(L, at::cross_entropy_loss(logits.reshape({-1, V}), t0.reshape({-1})));
  return 1;
}

const luaL_Reg functions[] = {
    {"_cross_entropy", guarded<torch_cross_entropy>},
    {nullptr, nullptr},
};

}  // namespace

/// Adds _cross_entropy to the torch table at index torch.
void register_loss(lua_State* L, int torch) {
  lua_pushvalue(L, torch);
  luaL_register(L, nullptr, functions);
  lua_pop(L, 1);
}

}  // namespace anatomy::lua
