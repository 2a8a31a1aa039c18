// The native of yaml.decode and yaml.read (lua/anatomy/io/yaml.lua): a YAML
// document (host/io/yaml.h) as Lua values. Maps become tables, sequences
// arrays from 1, null the sentinel the caller passes; a node an alias shares
// becomes one table reached twice, as PyYAML gives one object twice.
#include "bindings/common.h"
#include "bindings/parts.h"
#include "host/io/yaml.h"

#include <unordered_map>

namespace anatomy::lua {
namespace {

struct Pusher {
  lua_State* L;
  int null_index;
  int shared_index;  // a table: node address -> its Lua table, for nodes reached twice

  void scalar(const io::YamlValue& v) {
    switch (v.kind) {
      case io::YamlValue::Kind::null: lua_pushvalue(L, null_index); break;
      case io::YamlValue::Kind::boolean: lua_pushboolean(L, v.boolean); break;
      case io::YamlValue::Kind::number: lua_pushnumber(L, v.number); break;
      default: lua_pushlstring(L, v.string.data(), v.string.size()); break;
    }
  }

  // Depth is bounded by the parser (io::kMaxYamlDepth), so is this recursion.
  void push(const io::YamlPtr& node) {
    const io::YamlValue& v = *node;
    if (v.kind != io::YamlValue::Kind::sequence && v.kind != io::YamlValue::Kind::map) return scalar(v);
    if (!lua_checkstack(L, 8)) throw CallError("yaml: the Lua stack cannot hold the document's nesting");
    const bool shared = node.use_count() > 1;
    if (shared) {
      lua_pushlightuserdata(L, const_cast<io::YamlValue*>(&v));
      lua_rawget(L, shared_index);
      if (!lua_isnil(L, -1)) return;
      lua_pop(L, 1);
    }
    if (v.kind == io::YamlValue::Kind::sequence) {
      lua_createtable(L, static_cast<int>(v.items.size()), 0);
      for (size_t i = 0; i < v.items.size(); ++i) {
        push(v.items[i]);
        lua_rawseti(L, -2, static_cast<int>(i + 1));
      }
    } else {
      lua_createtable(L, 0, static_cast<int>(v.entries.size()));
      for (const auto& [key, value] : v.entries) {
        scalar(*key);
        push(value);
        lua_rawset(L, -3);
      }
    }
    if (shared) {
      lua_pushlightuserdata(L, const_cast<io::YamlValue*>(&v));
      lua_pushvalue(L, -2);
      lua_rawset(L, shared_index);
    }
  }
};

// torch._yaml_decode(text, source, null, caller) -> the document's value; an
// error starts with caller (the public function's name), then the source
int torch_yaml_decode(lua_State* L) {
  size_t n = 0;
  if (lua_type(L, 1) != LUA_TSTRING) throw ArgError(1, "string expected, got " + type_name(L, 1));
  const char* text = lua_tolstring(L, 1, &n);
  std::string source = check_string(L, 2);
  if (lua_isnone(L, 3)) throw ArgError(3, "the value null becomes expected");
  std::string caller = check_string(L, 4);
  io::YamlPtr root;
  try {
    root = io::parse_yaml(std::string(text, n), source);
  } catch (const io::YamlError& e) {
    throw CallError(caller + ": " + e.what());
  }
  lua_settop(L, 3);  // the null sentinel at 3, the shared nodes' table at 4
  lua_newtable(L);
  Pusher{L, 3, 4}.push(root);
  return 1;
}

const luaL_Reg yaml_functions[] = {
    {"_yaml_decode", guarded<torch_yaml_decode>},
    {nullptr, nullptr},
};

}  // namespace

void register_yaml(lua_State* L, int torch) {
  lua_pushvalue(L, torch);
  luaL_register(L, nullptr, yaml_functions);
  lua_pop(L, 1);
}

}  // namespace anatomy::lua
