// The Lua-visible NativeModule: userdata holding a shared_ptr to a built-in
// block (host/nn/blocks.h). lua/anatomy/nn/native.lua wraps it in the Lua
// module protocol; this file only constructs, runs and inspects blocks.
#include <ATen/ATen.h>

#include "bindings/bindings.h"
#include "bindings/common.h"
#include "host/nn/blocks.h"
#include "host/runtime.h"

namespace anatomy::lua {
namespace {

constexpr const char* kModuleMeta = "anatomy.NativeModule";
using BlockPtr = std::shared_ptr<nn::Block>;

BlockPtr& check_block(lua_State* L, int idx) {
  return check_userdata<BlockPtr>(L, idx, kModuleMeta, "NativeModule");
}

void push_block(lua_State* L, BlockPtr block) { push_userdata<BlockPtr>(L, kModuleMeta, std::move(block)); }

int64_t positive(lua_State* L, int idx, const char* what) {
  int64_t v = check_integer(L, idx);
  if (v < 1) throw ArgError(idx, std::string(what) + " must be positive, got " + std::to_string(v));
  return v;
}

double positive_number(lua_State* L, int idx, const char* what) {
  double v = check_number(L, idx);
  if (!(v > 0)) throw ArgError(idx, std::string(what) + " must be positive");
  return v;
}

// Constructors take plain positional arguments; the Lua classes read options.
int new_linear(lua_State* L) {
  push_block(L, std::make_shared<nn::Linear>(positive(L, 1, "in_features"), positive(L, 2, "out_features"),
                                             opt_boolean(L, 3, true)));
  return 1;
}

int new_embedding(lua_State* L) {
  int64_t positions = lua_isnoneornil(L, 3) ? 0 : positive(L, 3, "positions");
  push_block(L, std::make_shared<nn::Embedding>(positive(L, 1, "num_embeddings"), positive(L, 2, "embedding_dim"), positions));
  return 1;
}

int new_layer_norm(lua_State* L) {
  push_block(L, std::make_shared<nn::LayerNorm>(positive(L, 1, "dim"), positive_number(L, 2, "eps")));
  return 1;
}

int new_rms_norm(lua_State* L) {
  push_block(L, std::make_shared<nn::RMSNorm>(positive(L, 1, "dim"), positive_number(L, 2, "eps")));
  return 1;
}

int new_activation(lua_State* L) {
  try {
    push_block(L, std::make_shared<nn::Activation>(check_string(L, 1)));
  } catch (const std::invalid_argument& e) {
    throw ArgError(1, e.what());
  }
  return 1;
}

int new_dropout(lua_State* L) {
  try {
    push_block(L, std::make_shared<nn::Dropout>(check_number(L, 1)));
  } catch (const std::invalid_argument& e) {
    throw ArgError(1, e.what());
  }
  return 1;
}

int new_attention(lua_State* L) {
  int64_t dim = positive(L, 1, "dim"), heads = positive(L, 2, "heads");
  if (dim % heads != 0)
    throw ArgError(2, "dim " + std::to_string(dim) + " is not divisible by " + std::to_string(heads) + " heads");
  push_block(L, std::make_shared<nn::Attention>(dim, heads, opt_boolean(L, 3, true), opt_boolean(L, 4, true)));
  return 1;
}

int new_vibe_attention(lua_State* L) {
  push_block(L, std::make_shared<nn::VibeAttention>(opt_boolean(L, 1, true)));
  return 1;
}

int new_mlp(lua_State* L) {
  int64_t dim = positive(L, 1, "dim"), hidden = positive(L, 2, "hidden");
  std::string act = lua_isnoneornil(L, 3) ? "gelu" : check_string(L, 3);
  try {
    push_block(L, std::make_shared<nn::MLP>(dim, hidden, act, opt_boolean(L, 4, true)));
  } catch (const std::invalid_argument& e) {
    throw ArgError(3, e.what());
  }
  return 1;
}

// ---- methods -----------------------------------------------------------------

// m:forward(x): an InputError becomes a bad argument #1 (the input).
int module_forward(lua_State* L) {
  BlockPtr& b = check_block(L, 1);
  at::Tensor& x = check_tensor(L, 2);
  try {
    push_tensor(L, b->forward(x));
  } catch (const nn::InputError& e) {
    throw ArgError(2, e.what());
  }
  return 1;
}

// m:named_parameters() -> {{name, tensor}, ...} in registration order
int module_named_parameters(lua_State* L) {
  BlockPtr& b = check_block(L, 1);
  auto params = b->named_parameters(/*recurse=*/true);
  lua_createtable(L, static_cast<int>(params.size()), 0);
  int i = 0;
  for (const auto& item : params) {
    lua_createtable(L, 2, 0);
    lua_pushstring(L, item.key().c_str());
    lua_rawseti(L, -2, 1);
    push_tensor(L, item.value());
    lua_rawseti(L, -2, 2);
    lua_rawseti(L, -2, ++i);
  }
  return 1;
}

int module_train(lua_State* L) {
  check_block(L, 1)->train(opt_boolean(L, 2, true));
  return 0;
}

int module_kind(lua_State* L) {
  lua_pushstring(L, check_block(L, 1)->kind().c_str());
  return 1;
}

int module_describe(lua_State* L) {
  lua_pushstring(L, check_block(L, 1)->describe().c_str());
  return 1;
}

// m:keep_pattern(keep, grad): attention blocks keep their last pattern
int module_keep_pattern(lua_State* L) {
  BlockPtr& b = check_block(L, 1);
  b->keep_pattern = opt_boolean(L, 2, true);
  b->pattern_grad = opt_boolean(L, 3, false);
  if (!b->keep_pattern) b->pattern = at::Tensor();
  return 0;
}

int module_pattern(lua_State* L) {
  push_tensor(L, check_block(L, 1)->pattern);
  return 1;
}

// m:to(device_or_dtype): parameters change in place, so Lua references stay valid
int module_to(lua_State* L) {
  BlockPtr& b = check_block(L, 1);
  std::string s = check_string(L, 2);
  if (s == "cpu" || s.rfind("cuda", 0) == 0) b->to(parse_device_arg(s, 2));
  else b->to(parse_dtype(s, 2));
  return 0;
}

const luaL_Reg module_methods[] = {
    {"forward", guarded<module_forward>},
    {"named_parameters", guarded<module_named_parameters>},
    {"train", guarded<module_train>},
    {"kind", guarded<module_kind>},
    {"describe", guarded<module_describe>},
    {"keep_pattern", guarded<module_keep_pattern>},
    {"pattern", guarded<module_pattern>},
    {"to", guarded<module_to>},
    {nullptr, nullptr},
};

const luaL_Reg module_constructors[] = {
    {"Linear", guarded<new_linear>},
    {"Embedding", guarded<new_embedding>},
    {"LayerNorm", guarded<new_layer_norm>},
    {"RMSNorm", guarded<new_rms_norm>},
    {"Activation", guarded<new_activation>},
    {"Dropout", guarded<new_dropout>},
    {"Attention", guarded<new_attention>},
    {"VibeAttention", guarded<new_vibe_attention>},
    {"MLP", guarded<new_mlp>},
    {nullptr, nullptr},
};

}  // namespace

// Pushes the table of native block constructors (torch._native).
int luaopen_anatomy_module(lua_State* L) {
  define_userdata<BlockPtr>(L, kModuleMeta, "NativeModule", module_methods);
  lua_newtable(L);
  luaL_register(L, nullptr, module_constructors);
  return 1;
}

}  // namespace anatomy::lua
