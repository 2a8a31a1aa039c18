// The cross-entropy behind nn.functional.cross_entropy, with 1-based targets.
#include <ATen/ATen.h>
#include <c10/util/Optional.h>

#include "bindings/parts.h"
#include "bindings/common.h"
#include "host/tensor_format.h"

namespace anatomy::lua {
namespace {

// _cross_entropy(logits (..., V), targets (...) int64, 1-based[, reduction,
// ignore_index, label_smoothing, weight (V)]) -> the loss: reduction 0 none
// (shaped as targets), 1 mean (over the targets not ignored, weighted), 2
// sum, as at::cross_entropy_loss. ignore_index: a target value (nil: none)
// whose positions add nothing; it need not be a class id.
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
  int64_t reduction = luaL_optinteger(L, 3, 1);
  if (reduction < 0 || reduction > 2) throw ArgError(3, "reduction must be 0 (none), 1 (mean) or 2 (sum)");
  int64_t V = logits.size(-1);
  at::Tensor t0;
  constexpr int64_t kIgnored = -100;
  if (lua_isnoneornil(L, 4)) {
    t0 = zero_based_index(targets, V, 2);
  } else {
    at::Tensor ignored = targets.eq(static_cast<int64_t>(luaL_checkinteger(L, 4)));
    t0 = zero_based_index(targets.masked_fill(ignored, 1), V, 2).masked_fill(ignored, kIgnored);
  }
  double smoothing = luaL_optnumber(L, 5, 0.0);
  c10::optional<at::Tensor> weight;  // c10::optional: LibTorch 1.13 has no std::optional overload
  if (!lua_isnoneornil(L, 6)) {
    weight = check_tensor(L, 6);
    if (weight->dim() != 1 || weight->size(0) != V)
      throw ArgError(6, "weight has shape " + shape_string(weight->sizes()) + ", expected " + shape_string({V}) +
                            " (a weight a class)");
  }
  at::Tensor loss = at::cross_entropy_loss(logits.reshape({-1, V}), t0.reshape({-1}), weight, reduction, kIgnored, smoothing);
  if (reduction == 0) loss = loss.reshape(lead);
  push_tensor(L, loss);
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
