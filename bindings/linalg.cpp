// torch.linalg: singular values (and vectors), QR and norms, with PyTorch's argument names.
#include <ATen/ATen.h>

#include "bindings/parts.h"
#include "bindings/common.h"
#include "host/tensor_format.h"

namespace anatomy::lua {
namespace {

int linalg_svdvals(lua_State* L) {
  at::Tensor& a = check_tensor(L, 1);
  if (a.dim() < 2) throw ArgError(1, "svdvals needs a matrix (or a batch of them), got shape " + shape_string(a.sizes()));
  push_tensor(L, at::linalg_svdvals(a));
  return 1;
}

// linalg.svd(A, full_matrices = true) -> U, S, Vh (A = U diag(S) Vh), as
// torch.linalg.svd; S in descending order
int linalg_svd(lua_State* L) {
  at::Tensor& a = check_tensor(L, 1);
  if (a.dim() < 2) throw ArgError(1, "svd needs a matrix (or a batch of them), got shape " + shape_string(a.sizes()));
  bool full = opt_boolean(L, 2, true);
  auto [u, s, vh] = at::linalg_svd(a, full);
  push_tensor(L, u);
  push_tensor(L, s);
  push_tensor(L, vh);
  return 3;
}

// linalg.qr(A, mode = 'reduced') -> Q, R (A = Q R, Q with orthonormal
// columns, R upper triangular), as torch.linalg.qr; mode 'complete' or 'r'
// (R alone, Q empty) too
int linalg_qr(lua_State* L) {
  at::Tensor& a = check_tensor(L, 1);
  if (a.dim() < 2) throw ArgError(1, "qr needs a matrix (or a batch of them), got shape " + shape_string(a.sizes()));
  std::string mode = lua_isnoneornil(L, 2) ? "reduced" : check_string(L, 2);
  if (mode != "reduced" && mode != "complete" && mode != "r")
    throw ArgError(2, "mode must be 'reduced', 'complete' or 'r', got '" + mode + "'");
  auto [q, r] = at::linalg_qr(a, mode);
  push_tensor(L, q);
  push_tensor(L, r);
  return 2;
}

// linalg.norm(A, ord = nil, dim = nil, keepdim = false); ord may be a number,
// 'fro' or 'nuc'. Without ord or dim: the 2-norm of all elements.
int linalg_norm(lua_State* L) {
  at::Tensor& a = check_tensor(L, 1);
  std::vector<int64_t> dims;
  bool has_dims = !lua_isnoneornil(L, 3);
  if (has_dims) {
    int next = 0;
    dims = check_sizes(L, 3, &next);
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

const luaL_Reg functions[] = {
    {"svdvals", guarded<linalg_svdvals>},
    {"svd", guarded<linalg_svd>},
    {"norm", guarded<linalg_norm>},
    {"qr", guarded<linalg_qr>},
    {nullptr, nullptr},
};

}  // namespace

/// Adds the torch.linalg table to the torch table at index torch.
void register_linalg(lua_State* L, int torch) {
  lua_newtable(L);
  luaL_register(L, nullptr, functions);
  lua_setfield(L, torch, "linalg");
}

}  // namespace anatomy::lua
