// Shape methods of Tensor: sizes, views, reshapes, permutations, slicing
// along a dimension and splitting. Dims and indices are 1-based (common.h).
#include <ATen/ATen.h>

#include "bindings/parts.h"
#include "bindings/common.h"
#include "host/tensor_format.h"

namespace anatomy::lua {
namespace {

// Dims given as numbers from `start` on, or as one table: wrapped to 0-based.
std::vector<int64_t> check_dims(lua_State* L, int start, int64_t ndim) {
  std::vector<int64_t> dims = check_sizes(L, start);
  for (auto& d : dims) d = wrap_dim(d, ndim, start);
  return dims;
}

int tensor_size(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  if (lua_isnoneornil(L, 2)) {
    push_sizes(L, t.sizes());
  } else {
    lua_pushnumber(L, static_cast<lua_Number>(t.size(check_dim(L, 2, t.dim()))));
  }
  return 1;
}

int tensor_stride(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  if (lua_isnoneornil(L, 2)) push_sizes(L, t.strides());
  else lua_pushnumber(L, static_cast<lua_Number>(t.stride(check_dim(L, 2, t.dim()))));
  return 1;
}

int tensor_dim(lua_State* L) {
  lua_pushnumber(L, static_cast<lua_Number>(check_tensor(L, 1).dim()));
  return 1;
}

int tensor_numel(lua_State* L) {
  lua_pushnumber(L, static_cast<lua_Number>(check_tensor(L, 1).numel()));
  return 1;
}

int tensor_is_contiguous(lua_State* L) {
  lua_pushboolean(L, check_tensor(L, 1).is_contiguous());
  return 1;
}

// view/reshape: the element counts must agree (one size may be -1).
void check_reshape(const at::Tensor& t, const std::vector<int64_t>& sizes, int arg) {
  int64_t known = 1, infer = 0;
  for (int64_t s : sizes) {
    if (s == -1) ++infer;
    else if (s < 0) throw ArgError(arg, "invalid size " + std::to_string(s));
    else if (__builtin_mul_overflow(known, s, &known))
      throw ArgError(arg, "shape " + shape_string(sizes) + " has more elements than an int64 can count");
  }
  bool ok = infer == 0 ? known == t.numel() : (infer == 1 && known != 0 && t.numel() % known == 0);
  if (!ok)
    throw ArgError(arg, "shape " + shape_string(sizes) + " does not match " + std::to_string(t.numel()) +
                            " elements of shape " + shape_string(t.sizes()));
}

// x:view(sizes) and x:reshape(sizes) (a view that must share x's storage, or a copy where it cannot)
template <bool View>
int tensor_reshape(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  auto sizes = check_sizes(L, 2);
  check_reshape(t, sizes, 2);
  push_tensor(L, View ? t.view(sizes) : t.reshape(sizes));
  return 1;
}

int tensor_view_as(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  at::Tensor& o = check_tensor(L, 2);
  check_reshape(t, o.sizes().vec(), 2);
  push_tensor(L, t.view_as(o));
  return 1;
}

int tensor_flatten(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  int64_t n = std::max<int64_t>(t.dim(), 1);
  int64_t start = lua_isnoneornil(L, 2) ? 0 : check_dim(L, 2, n);
  int64_t end = lua_isnoneornil(L, 3) ? n - 1 : check_dim(L, 3, n);
  if (start > end) throw ArgError(3, "end dimension must not come before start dimension");
  push_tensor(L, t.flatten(start, end));
  return 1;
}

int tensor_transpose(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  push_tensor(L, t.transpose(check_dim(L, 2, t.dim()), check_dim(L, 3, t.dim())));
  return 1;
}

int tensor_t(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  if (t.dim() > 2) throw ArgError(1, "t() expects a tensor with at most 2 dimensions, got " + std::to_string(t.dim()));
  push_tensor(L, t.t());
  return 1;
}

int tensor_permute(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  auto dims = check_dims(L, 2, t.dim());
  if (static_cast<int64_t>(dims.size()) != t.dim())
    throw ArgError(2, "permute needs " + std::to_string(t.dim()) + " dimensions, got " + std::to_string(dims.size()));
  std::vector<bool> seen(t.dim());
  for (int64_t d : dims) {
    if (seen[d]) throw ArgError(2, "dimension " + std::to_string(d + 1) + " repeats in permute");
    seen[d] = true;
  }
  push_tensor(L, t.permute(dims));
  return 1;
}

// x:flip(d1, d2, ...) or x:flip({d1, ...}): reverses the order along those (1-based) dimensions
int tensor_flip(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  if (lua_isnoneornil(L, 2)) throw ArgError(2, "flip needs the dimensions to reverse");
  auto dims = check_dims(L, 2, t.dim());
  push_tensor(L, t.flip(dims));
  return 1;
}

int tensor_contiguous(lua_State* L) {
  push_tensor(L, check_tensor(L, 1).contiguous());
  return 1;
}

int tensor_squeeze(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  if (lua_isnoneornil(L, 2)) push_tensor(L, t.squeeze());
  else push_tensor(L, t.squeeze(check_dim(L, 2, t.dim())));
  return 1;
}

int tensor_unsqueeze(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  // The new dimension may go anywhere from 1 to dim+1; -1 puts it last.
  push_tensor(L, t.unsqueeze(check_dim(L, 2, t.dim() + 1)));
  return 1;
}

int tensor_expand(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  auto sizes = check_sizes(L, 2);
  if (static_cast<int64_t>(sizes.size()) < t.dim())
    throw ArgError(2, "expanded shape " + shape_string(sizes) + " has fewer dimensions than " + shape_string(t.sizes()));
  size_t off = sizes.size() - t.dim();
  for (int64_t i = 0; i < t.dim(); ++i) {
    int64_t want = sizes[off + i];
    if (want != -1 && want != t.size(i) && t.size(i) != 1)
      throw ArgError(2, "cannot expand shape " + shape_string(t.sizes()) + " to " + shape_string(sizes));
  }
  push_tensor(L, t.expand(sizes));
  return 1;
}

int tensor_expand_as(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  at::Tensor& o = check_tensor(L, 2);
  push_tensor(L, t.expand_as(o));
  return 1;
}

int tensor_repeat(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  auto sizes = check_sizes(L, 2);
  if (static_cast<int64_t>(sizes.size()) < t.dim())
    throw ArgError(2, "repeat needs at least " + std::to_string(t.dim()) + " counts, got " + std::to_string(sizes.size()));
  push_tensor(L, t.repeat(sizes));
  return 1;
}

// x:tile(reps...): `repeat` is a Lua keyword, so x:repeat(...) cannot be written;
// tile is PyTorch's other name for it (fewer reps than dims are padded with 1).
int tensor_tile(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  auto reps = check_sizes(L, 2);
  for (int64_t r : reps)
    if (r < 0) throw ArgError(2, "repetitions must be non-negative, got " + shape_string(reps));
  push_tensor(L, t.tile(reps));
  return 1;
}

int tensor_narrow(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  int64_t d = check_dim(L, 2, t.dim());
  int64_t start = wrap_index(check_integer(L, 3), t.size(d), 3, d);
  int64_t length = check_integer(L, 4);
  if (length < 0 || start + length > t.size(d))
    throw ArgError(4, "length " + std::to_string(length) + " from index " + std::to_string(start + 1) +
                          " runs past dimension " + std::to_string(d + 1) + " of size " + std::to_string(t.size(d)));
  push_tensor(L, t.narrow(d, start, length));
  return 1;
}

int tensor_select(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  int64_t d = check_dim(L, 2, t.dim());
  push_tensor(L, t.select(d, wrap_index(check_integer(L, 3), t.size(d), 3, d)));
  return 1;
}

int tensor_chunk(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  int64_t n = check_integer(L, 2);
  if (n < 1) throw ArgError(2, "number of chunks must be positive, got " + std::to_string(n));
  int64_t d = lua_isnoneornil(L, 3) ? 0 : check_dim(L, 3, t.dim());
  // An empty dimension splits into n empty chunks (as in PyTorch): n tensors
  // made at once, so n is bounded (1e12 of them was a request for terabytes).
  constexpr int64_t kMostEmptyChunks = int64_t(1) << 20;
  if (t.size(d) == 0 && n > kMostEmptyChunks)
    throw ArgError(2, std::to_string(n) + " chunks of an empty dimension would be " + std::to_string(n) +
                          " empty tensors (at most " + std::to_string(kMostEmptyChunks) + ")");
  push_tensor_table(L, t.chunk(n, d));
  return 1;
}

int tensor_split(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  int64_t d = lua_isnoneornil(L, 3) ? 0 : check_dim(L, 3, t.dim());
  if (lua_type(L, 2) == LUA_TTABLE) {
    auto sizes = check_sizes(L, 2);
    int64_t total = 0;
    for (int64_t s : sizes) total += s;
    if (total != t.size(d))
      throw ArgError(2, "split sizes add up to " + std::to_string(total) + " but dimension " + std::to_string(d + 1) +
                            " has size " + std::to_string(t.size(d)));
    push_tensor_table(L, t.split_with_sizes(sizes, d));
  } else {
    int64_t size = check_integer(L, 2);
    if (size < 1) throw ArgError(2, "split size must be positive, got " + std::to_string(size));
    push_tensor_table(L, t.split(size, d));
  }
  return 1;
}

int tensor_unbind(lua_State* L) {
  at::Tensor& t = check_tensor(L, 1);
  push_tensor_table(L, t.unbind(lua_isnoneornil(L, 2) ? 0 : check_dim(L, 2, t.dim())));
  return 1;
}

const luaL_Reg shape_methods[] = {
    {"size", guarded<tensor_size>},
    {"stride", guarded<tensor_stride>},
    {"dim", guarded<tensor_dim>},
    {"numel", guarded<tensor_numel>},
    {"nelement", guarded<tensor_numel>},
    {"is_contiguous", guarded<tensor_is_contiguous>},
    {"view", guarded<tensor_reshape<true>>},
    {"reshape", guarded<tensor_reshape<false>>},
    {"view_as", guarded<tensor_view_as>},
    {"flatten", guarded<tensor_flatten>},
    {"transpose", guarded<tensor_transpose>},
    {"t", guarded<tensor_t>},
    {"permute", guarded<tensor_permute>},
    {"contiguous", guarded<tensor_contiguous>},
    {"flip", guarded<tensor_flip>},
    {"squeeze", guarded<tensor_squeeze>},
    {"unsqueeze", guarded<tensor_unsqueeze>},
    {"expand", guarded<tensor_expand>},
    {"expand_as", guarded<tensor_expand_as>},
    {"repeat", guarded<tensor_repeat>},  // x['repeat'](x, ...)
    {"tile", guarded<tensor_tile>},
    {"narrow", guarded<tensor_narrow>},
    {"select", guarded<tensor_select>},
    {"chunk", guarded<tensor_chunk>},
    {"split", guarded<tensor_split>},
    {"unbind", guarded<tensor_unbind>},
    {nullptr, nullptr},
};

}  // namespace

void register_tensor_shape(lua_State* L, int methods) { luaL_register(L, nullptr, shape_methods); }

}  // namespace anatomy::lua
