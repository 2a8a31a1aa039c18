// torch.save_safetensors and torch.load_safetensors: Lua tables of named
// tensors to and from safetensors files (host/io/safetensors.h).
#include <ATen/ATen.h>

#include "bindings/parts.h"
#include "bindings/common.h"
#include "host/io/digest.h"
#include "host/io/safetensors.h"
#include "host/tensor_format.h"
#include "host/runtime.h"

#include <algorithm>

namespace anatomy::lua {
namespace {

// A string-keyed Lua table at idx, sorted by key for a deterministic file.
io::NamedTensors check_named_tensors(lua_State* L, int idx) {
  if (lua_type(L, idx) != LUA_TTABLE) throw ArgError(idx, "table of name = Tensor expected, got " + type_name(L, idx));
  io::NamedTensors out;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    if (lua_type(L, -2) != LUA_TSTRING) {
      std::string got = type_name(L, -2);
      lua_pop(L, 2);
      throw ArgError(idx, "tensor names must be strings, got a " + got + " key");
    }
    std::string name = lua_tostring(L, -2);
    at::Tensor* t = to_tensor(L, -1);
    if (!t) {
      std::string got = type_name(L, -1);
      lua_pop(L, 2);
      throw ArgError(idx, "entry '" + name + "' is " + got + ", expected a Tensor");
    }
    out.emplace_back(name, *t);
    lua_pop(L, 1);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

// torch.save_safetensors(path, {name = tensor, ...}, [{key = 'value', ...}])
int torch_save_safetensors(lua_State* L) {
  std::string path = check_string(L, 1);
  io::NamedTensors tensors = check_named_tensors(L, 2);
  std::map<std::string, std::string> metadata;
  if (!lua_isnoneornil(L, 3)) {
    if (lua_type(L, 3) != LUA_TTABLE) throw ArgError(3, "metadata table expected, got " + type_name(L, 3));
    lua_pushnil(L);
    while (lua_next(L, 3)) {
      if (lua_type(L, -2) != LUA_TSTRING || !lua_isstring(L, -1)) {
        lua_pop(L, 2);
        throw ArgError(3, "metadata keys and values must be strings");
      }
      lua_pushvalue(L, -1);  // tostring a number without touching the key
      metadata[lua_tostring(L, -3)] = lua_tostring(L, -1);
      lua_pop(L, 2);
    }
  }
  try {
    io::save_safetensors(path, tensors, metadata);
  } catch (const io::SafetensorsError& e) {
    throw CallError(e.what());
  }
  return 0;
}

// torch.tensors_sha256({name = tensor, ...}) -> the SHA-256 (hex) of the
// tensors' names, dtypes, shapes and values, in name order: two state dicts
// hash alike exactly when they hold the same tensors (on any device).
int torch_tensors_sha256(lua_State* L) {
  io::NamedTensors tensors = check_named_tensors(L, 1);
  std::vector<std::string> headers;
  std::vector<at::Tensor> bytes;
  headers.reserve(tensors.size());
  bytes.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    std::string header = name + '\0' + std::string(c10::toString(t.scalar_type())) + '\0';
    for (int64_t d : t.sizes()) header += std::to_string(d) + ',';
    headers.push_back(header + '\0');
    bytes.push_back(t.detach().to(at::kCPU).contiguous());
  }
  std::vector<std::string_view> pieces;
  for (size_t i = 0; i < headers.size(); ++i) {
    pieces.emplace_back(headers[i]);
    pieces.emplace_back(static_cast<const char*>(bytes[i].data_ptr()), bytes[i].nbytes());
  }
  std::string hex = io::sha256_hex(pieces);
  lua_pushlstring(L, hex.data(), hex.size());
  return 1;
}

// torch.load_safetensors(path) -> {name = tensor, ...}, metadata, names (file order)
int torch_load_safetensors(lua_State* L) {
  std::string path = check_string(L, 1);
  io::SafetensorsFile file;
  try {
    file = io::load_safetensors(path);
  } catch (const io::SafetensorsError& e) {
    throw CallError(e.what());
  }
  lua_createtable(L, 0, static_cast<int>(file.tensors.size()));
  for (const auto& [name, t] : file.tensors) {
    push_tensor(L, t.to(default_device()));
    lua_setfield(L, -2, name.c_str());
  }
  lua_createtable(L, 0, static_cast<int>(file.metadata.size()));
  for (const auto& [k, v] : file.metadata) {
    lua_pushlstring(L, v.data(), v.size());
    lua_setfield(L, -2, k.c_str());
  }
  lua_createtable(L, static_cast<int>(file.tensors.size()), 0);
  for (size_t i = 0; i < file.tensors.size(); ++i) {
    lua_pushstring(L, file.tensors[i].first.c_str());
    lua_rawseti(L, -2, static_cast<int>(i + 1));
  }
  return 3;
}

// torch.safe_open(path) -> f: a file's header read and checked, its tensors
// read one at a time (as safetensors' safe_open): f:keys(), f:get_tensor(name),
// f:shape(name), f:dtype(name), f:metadata().
constexpr const char* kSafeOpenMeta = "anatomy.SafeOpen";
using IndexPtr = std::shared_ptr<io::SafetensorsIndex>;

io::SafetensorsIndex& check_index(lua_State* L) { return *check_userdata<IndexPtr>(L, 1, kSafeOpenMeta, "safe_open file"); }

const io::SafetensorsIndex::Entry& check_entry(lua_State* L, const io::SafetensorsIndex& index) {
  std::string name = check_string(L, 2);
  const auto* e = index.find(name);
  if (!e) throw ArgError(2, "no tensor " + name + " in '" + index.path + "'");
  return *e;
}

int torch_safe_open(lua_State* L) {
  std::string path = check_string(L, 1);
  try {
    push_userdata<IndexPtr>(L, kSafeOpenMeta, std::make_shared<io::SafetensorsIndex>(io::open_safetensors(path)));
  } catch (const io::SafetensorsError& e) {
    throw CallError(e.what());
  }
  return 1;
}

int safe_keys(lua_State* L) {
  const auto& index = check_index(L);
  lua_createtable(L, static_cast<int>(index.entries.size()), 0);
  for (size_t i = 0; i < index.entries.size(); ++i) {
    lua_pushstring(L, index.entries[i].name.c_str());
    lua_rawseti(L, -2, static_cast<int>(i + 1));
  }
  return 1;
}

int safe_get_tensor(lua_State* L) {
  const auto& index = check_index(L);
  const auto& e = check_entry(L, index);
  try {
    push_tensor(L, io::read_tensor(index, e).to(default_device()));
  } catch (const io::SafetensorsError& err) {
    throw CallError(err.what());
  }
  return 1;
}

// f:read_into(name, t) -> whether it read: a parameter whose dtype, shape and
// layout (contiguous, CPU) match the stored tensor gets its bytes straight
// from the file, autograd untouched; false (nothing read) when they do not.
int safe_read_into(lua_State* L) {
  const auto& index = check_index(L);
  const auto& e = check_entry(L, index);
  at::Tensor& out = check_tensor(L, 3);
  bool fits = out.is_cpu() && out.is_contiguous() && out.scalar_type() == e.type && e.type != at::kBool &&
              out.sizes() == at::IntArrayRef(e.shape);
  if (fits) {
    try {
      at::Tensor target = out.detach();  // the same storage, outside autograd's view
      io::read_tensor_into(index, e, target);
      target.unsafeGetTensorImpl()->bump_version();
    } catch (const io::SafetensorsError& err) {
      throw CallError(err.what());
    }
  }
  lua_pushboolean(L, fits);
  return 1;
}

int safe_shape(lua_State* L) {
  const auto& index = check_index(L);
  push_sizes(L, check_entry(L, index).shape);
  return 1;
}

int safe_dtype(lua_State* L) {
  const auto& index = check_index(L);
  lua_pushstring(L, dtype_name(check_entry(L, index).type));
  return 1;
}

int safe_metadata(lua_State* L) {
  const auto& index = check_index(L);
  lua_createtable(L, 0, static_cast<int>(index.metadata.size()));
  for (const auto& [k, v] : index.metadata) {
    lua_pushlstring(L, v.data(), v.size());
    lua_setfield(L, -2, k.c_str());
  }
  return 1;
}

const luaL_Reg safe_open_methods[] = {
    {"keys", guarded<safe_keys>},
    {"get_tensor", guarded<safe_get_tensor>},
    {"read_into", guarded<safe_read_into>},
    {"shape", guarded<safe_shape>},
    {"dtype", guarded<safe_dtype>},
    {"metadata", guarded<safe_metadata>},
    {nullptr, nullptr},
};

const luaL_Reg safetensors_functions[] = {
    {"safe_open", guarded<torch_safe_open>},
    {"save_safetensors", guarded<torch_save_safetensors>},
    {"load_safetensors", guarded<torch_load_safetensors>},
    {"tensors_sha256", guarded<torch_tensors_sha256>},
    {nullptr, nullptr},
};

}  // namespace

void register_safetensors(lua_State* L, int torch) {
  define_userdata<IndexPtr>(L, kSafeOpenMeta, "safe_open file", safe_open_methods);
  lua_pushvalue(L, torch);
  luaL_register(L, nullptr, safetensors_functions);
  lua_pop(L, 1);
}

}  // namespace anatomy::lua
