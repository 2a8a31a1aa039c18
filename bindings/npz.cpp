// The natives of torch.load_npz and torch.save_npz (lua/anatomy/torch/init.lua):
// NumPy .npz archives to and from Lua tables of named tensors (host/io/npz.h).
#include <ATen/ATen.h>

#include "bindings/common.h"
#include "bindings/parts.h"
#include "host/io/npz.h"
#include "host/runtime.h"

#include <algorithm>

namespace anatomy::lua {
namespace {

// torch._load_npz(path) -> {name = tensor, ...}, {names in archive order}
int torch_load_npz(lua_State* L) {
  std::string path = check_string(L, 1);
  std::vector<std::pair<std::string, at::Tensor>> arrays;
  try {
    arrays = io::load_npz(path);
  } catch (const io::NpzError& e) {
    throw CallError(std::string("torch.load_npz: ") + e.what());
  }
  lua_createtable(L, 0, static_cast<int>(arrays.size()));
  for (const auto& [name, t] : arrays) {
    lua_pushlstring(L, name.data(), name.size());
    push_tensor(L, t.to(default_device()));
    lua_rawset(L, -3);
  }
  lua_createtable(L, static_cast<int>(arrays.size()), 0);
  for (size_t i = 0; i < arrays.size(); ++i) {
    lua_pushlstring(L, arrays[i].first.data(), arrays[i].first.size());
    lua_rawseti(L, -2, static_cast<int>(i + 1));
  }
  return 2;
}

// torch._save_npz(path, {name = tensor, ...}, compressed): the members in name order
int torch_save_npz(lua_State* L) {
  std::string path = check_string(L, 1);
  if (lua_type(L, 2) != LUA_TTABLE) throw ArgError(2, "table of name = Tensor expected, got " + type_name(L, 2));
  bool compressed = lua_toboolean(L, 3) != 0;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  lua_pushnil(L);
  while (lua_next(L, 2)) {
    if (lua_type(L, -2) != LUA_TSTRING) {
      std::string got = type_name(L, -2);
      lua_pop(L, 2);
      throw ArgError(2, "array names must be strings, got a " + got + " key");
    }
    std::string name = lua_tostring(L, -2);
    at::Tensor* t = to_tensor(L, -1);
    if (!t) {
      std::string got = type_name(L, -1);
      lua_pop(L, 2);
      throw ArgError(2, "entry '" + name + "' is " + got + ", expected a Tensor");
    }
    tensors.emplace_back(name, *t);
    lua_pop(L, 1);
  }
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  try {
    io::save_npz(path, tensors, compressed);
  } catch (const io::NpzError& e) {
    throw CallError(std::string("torch.save_npz: ") + e.what());
  }
  return 0;
}

const luaL_Reg npz_functions[] = {
    {"_load_npz", guarded<torch_load_npz>},
    {"_save_npz", guarded<torch_save_npz>},
    {nullptr, nullptr},
};

}  // namespace

void register_npz(lua_State* L, int torch) {
  lua_pushvalue(L, torch);
  luaL_register(L, nullptr, npz_functions);
  lua_pop(L, 1);
}

}  // namespace anatomy::lua
