// The rest of the torch table: torch.linalg, the cross-entropy behind
// nn.functional, the RNG state, and small services for the Lua library
// (a monotonic clock, terminal detection, zlib sizes).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "bindings/bindings.h"
#include "bindings/common.h"
#include "host/tensor_format.h"

#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <mutex>

namespace anatomy::lua {
namespace {

// torch.get_rng_state() -> uint8 tensor: the CPU generator's state (PyTorch's layout)
int torch_get_rng_state(lua_State* L) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  push_tensor(L, gen.get_state());
  return 1;
}

// torch.set_rng_state(state): restores what get_rng_state returned
int torch_set_rng_state(lua_State* L) {
  at::Tensor& state = check_tensor(L, 1);
  if (state.scalar_type() != at::kByte || state.dim() != 1)
    throw ArgError(1, "expected the uint8 tensor that get_rng_state returns");
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  try {
    gen.set_state(state.cpu());
  } catch (const c10::Error& e) {
    throw ArgError(1, "not a generator state (" + std::string(e.what_without_backtrace()).substr(0, 80) + ")");
  }
  return 0;
}

// ---- losses -------------------------------------------------------------------------

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

// ---- clocks, terminals, compression ------------------------------------------

// torch._now() -> seconds on a monotonic clock (for rates and ETAs)
int torch_now(lua_State* L) {
  lua_pushnumber(L, std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count());
  return 1;
}

// torch._isatty(fd) -> whether the file descriptor is a terminal
int torch_isatty(lua_State* L) {
  lua_pushboolean(L, isatty(static_cast<int>(check_integer(L, 1))));
  return 1;
}

// torch._compressed_size(s, level = 9) -> bytes of s after zlib compression
int torch_compressed_size(lua_State* L) {
  size_t n;
  const char* s = luaL_checklstring(L, 1, &n);
  int level = lua_isnoneornil(L, 2) ? 9 : static_cast<int>(check_integer(L, 2));
  if (level < 0 || level > 9) throw ArgError(2, "zlib level must be 0..9");
  uLongf out = compressBound(n);
  std::vector<Bytef> buf(out);
  if (compress2(buf.data(), &out, reinterpret_cast<const Bytef*>(s), n, level) != Z_OK)
    throw CallError("zlib could not compress the text");
  lua_pushnumber(L, static_cast<lua_Number>(out));
  return 1;
}

// ---- torch.linalg ---------------------------------------------------------------

int linalg_svdvals(lua_State* L) {
  at::Tensor& a = check_tensor(L, 1);
  if (a.dim() < 2) throw ArgError(1, "svdvals needs a matrix (or a batch of them), got shape " + shape_string(a.sizes()));
  push_tensor(L, at::linalg_svdvals(a));
  return 1;
}

// linalg.norm(A, ord = nil, dim = nil, keepdim = false); ord may be a number,
// 'fro' or 'nuc'. Without ord or dim: the 2-norm of all elements.
int linalg_norm(lua_State* L) {
  at::Tensor& a = check_tensor(L, 1);
  std::vector<int64_t> dims;
  bool has_dims = !lua_isnoneornil(L, 3);
  if (has_dims) {
    dims = check_sizes(L, 3);
    for (auto& d : dims) d = wrap_dim(d, a.dim(), 3);
  }
  bool keepdim = opt_boolean(L, 4, false);
  at::OptionalIntArrayRef dim_ref = has_dims ? at::OptionalIntArrayRef(dims) : c10::nullopt;
  if (lua_type(L, 2) == LUA_TSTRING) {
    std::string ord = lua_tostring(L, 2);
    if (ord != "fro" && ord != "nuc") throw ArgError(2, "ord must be a number, 'fro' or 'nuc', got '" + ord + "'");
    push_tensor(L, at::linalg_norm(a, ord, dim_ref, keepdim));
  } else {
    c10::optional<at::Scalar> ord;
    if (!lua_isnoneornil(L, 2)) ord = check_number(L, 2);
    push_tensor(L, at::linalg_norm(a, ord, dim_ref, keepdim));
  }
  return 1;
}

const luaL_Reg linalg_functions[] = {
    {"svdvals", guarded<linalg_svdvals>},
    {"norm", guarded<linalg_norm>},
    {nullptr, nullptr},
};

const luaL_Reg util_functions[] = {
    {"_cross_entropy", guarded<torch_cross_entropy>},
    {"_now", guarded<torch_now>},
    {"_isatty", guarded<torch_isatty>},
    {"_compressed_size", guarded<torch_compressed_size>},
    {"get_rng_state", guarded<torch_get_rng_state>},
    {"set_rng_state", guarded<torch_set_rng_state>},
    {nullptr, nullptr},
};

}  // namespace

void register_torch_util(lua_State* L, int torch) {
  lua_pushvalue(L, torch);
  luaL_register(L, nullptr, util_functions);
  lua_newtable(L);
  luaL_register(L, nullptr, linalg_functions);
  lua_setfield(L, -2, "linalg");
  lua_pop(L, 1);
}

}  // namespace anatomy::lua
