// The Lua-visible Native: userdata holding a shared_ptr to a built-in
// block (host/nn/blocks.h). lua/anatomy/nn/Native.lua and one file per block
// wrap it in the Lua module protocol; this file only constructs, runs and
// inspects blocks.
#include <ATen/ATen.h>

#include "bindings/parts.h"
#include "bindings/common.h"
#include "host/nn/blocks.h"
#include "host/runtime.h"
#include "host/tensor_format.h"

#include <optional>
#include <type_traits>

namespace anatomy::lua {
namespace {

constexpr const char* kNativeMeta = "anatomy.Native";
using NativePtr = std::shared_ptr<nn::Native>;

NativePtr& check_native(lua_State* L, int idx) {
  return check_userdata<NativePtr>(L, idx, kNativeMeta, "Native");
}

void push_native(lua_State* L, NativePtr block) { push_userdata<NativePtr>(L, kNativeMeta, std::move(block)); }

// Builds a block; an OptionError becomes a bad argument: the positional
// argument it names (`positional`: field -> argument), else the options table.
template <typename Make>
void push_new(lua_State* L, int options_arg, std::initializer_list<std::pair<const char*, int>> positional, Make make) {
  NativePtr block;
  try {
    block = make();
  } catch (const nn::OptionError& e) {
    int arg = options_arg;
    for (const auto& [field, index] : positional)
      if (e.field == field) arg = index;
    throw ArgError(arg, e.what());
  }
  push_native(L, std::move(block));
}

// Each constructor takes the block's required sizes, then an options table
// that maps onto the block's options struct here, in one place; the block
// checks every value (host/nn/blocks.cpp).

// Linear(in, out, {bias})
int new_linear(lua_State* L) {
  nn::LinearOptions o(check_integer(L, 1), check_integer(L, 2));
  if (auto v = option<bool>(L, 3, "bias")) o.bias(*v);
  push_new(L, 3, {{"in_features", 1}, {"out_features", 2}}, [&] { return std::make_shared<nn::Linear>(o); });
  return 1;
}

// Embedding(n, dim, {positions})
int new_embedding(lua_State* L) {
  nn::EmbeddingOptions o(check_integer(L, 1), check_integer(L, 2));
  if (auto v = option<int64_t>(L, 3, "positions")) o.positions(*v);
  push_new(L, 3, {{"num_embeddings", 1}, {"embedding_dim", 2}}, [&] { return std::make_shared<nn::Embedding>(o); });
  return 1;
}

// LayerNorm(dim, {eps = 1e-5}), RMSNorm(dim, {eps = 1e-6, offset = 0})
template <typename Norm>
int new_norm(lua_State* L, double default_eps) {
  nn::NormOptions o(check_integer(L, 1), default_eps);
  if (auto v = option<double>(L, 2, "eps")) o.eps(*v);
  if constexpr (std::is_same_v<Norm, nn::RMSNorm>) {
    if (auto v = option<double>(L, 2, "offset")) o.offset(*v);
  }
  push_new(L, 2, {{"dim", 1}}, [&] { return std::make_shared<Norm>(o); });
  return 1;
}
int new_layer_norm(lua_State* L) { return new_norm<nn::LayerNorm>(L, 1e-5); }
int new_rms_norm(lua_State* L) { return new_norm<nn::RMSNorm>(L, 1e-6); }

// Activation(name): "gelu", "gelu_tanh" or "relu"
int new_activation(lua_State* L) {
  std::string name = check_string(L, 1);
  push_new(L, 1, {}, [&] { return std::make_shared<nn::Activation>(name); });
  return 1;
}

// Dropout(p)
int new_dropout(lua_State* L) {
  double p = check_number(L, 1);
  push_new(L, 1, {}, [&] { return std::make_shared<nn::Dropout>(p); });
  return 1;
}

// Attention(dim, heads, {causal, bias})
int new_attention(lua_State* L) {
  nn::AttentionOptions o(check_integer(L, 1), check_integer(L, 2));
  if (auto v = option<bool>(L, 3, "causal")) o.causal(*v);
  if (auto v = option<bool>(L, 3, "bias")) o.bias(*v);
  push_new(L, 3, {{"dim", 1}, {"heads", 2}}, [&] { return std::make_shared<nn::Attention>(o); });
  return 1;
}

// VibeAttention({causal})
int new_vibe_attention(lua_State* L) {
  bool causal = option<bool>(L, 1, "causal").value_or(true);
  push_new(L, 1, {}, [&] { return std::make_shared<nn::VibeAttention>(causal); });
  return 1;
}

// MLP(dim, hidden, {activation, bias})
int new_mlp(lua_State* L) {
  nn::MLPOptions o(check_integer(L, 1), check_integer(L, 2));
  if (auto v = option<std::string>(L, 3, "activation")) o.activation(*v);
  if (auto v = option<bool>(L, 3, "bias")) o.bias(*v);
  push_new(L, 3, {{"dim", 1}, {"hidden", 2}}, [&] { return std::make_shared<nn::MLP>(o); });
  return 1;
}

// ---- methods -----------------------------------------------------------------

// Thrown out of a hook callback whose Lua function raised an error (left on
// the stack top): module_forward raises that error as it was.
struct HookFailed {};

// m:forward(x[, hook, wanted]): an InputError becomes a bad argument #1 (the
// input). With hook (a function(name, t) -> t or nil), the block's hook
// points pass through it for this call (host/nn/blocks.h); wanted lists the
// costly points to compute (an attention's "result").
int module_forward(lua_State* L) {
  NativePtr& b = check_native(L, 1);
  at::Tensor& x = check_tensor(L, 2);
  if (!lua_isnoneornil(L, 3) && lua_type(L, 3) != LUA_TFUNCTION) throw ArgError(3, "function expected, got " + type_name(L, 3));
  struct Unhook {  // the hook lives for this call only, whatever happens in it
    nn::Native& block;
    ~Unhook() {
      block.hook = nullptr;
      block.wanted.clear();
    }
  } unhook{*b};
  if (lua_type(L, 3) == LUA_TFUNCTION) {
    if (lua_istable(L, 4))
      for (int i = 1; i <= static_cast<int>(lua_objlen(L, 4)); ++i) {
        lua_rawgeti(L, 4, i);
        if (lua_type(L, -1) == LUA_TSTRING) b->wanted.emplace_back(lua_tostring(L, -1));
        lua_pop(L, 1);
      }
    b->hook = [L](const char* name, const at::Tensor& t) -> at::Tensor {
      lua_pushvalue(L, 3);
      lua_pushstring(L, name);
      push_tensor(L, t);
      if (lua_pcall(L, 2, 1, 0) != 0) throw HookFailed{};
      at::Tensor out = t;
      if (!lua_isnil(L, -1)) {
        at::Tensor* r = to_tensor(L, -1);
        if (!r || r->sizes() != t.sizes()) {
          std::string got = r ? "a tensor of shape " + anatomy::shape_string(r->sizes()) : std::string("a ") + luaL_typename(L, -1);
          lua_pop(L, 1);
          lua_pushstring(L, ("the hook on '" + std::string(name) + "' returned " + got + ", expected nil or a tensor of shape " +
                             anatomy::shape_string(t.sizes())).c_str());
          throw HookFailed{};
        }
        out = *r;
      }
      lua_pop(L, 1);
      return out;
    };
  }
  at::Tensor y;
  bool failed = false;
  try {
    y = b->forward(x);
  } catch (const nn::InputError& e) {
    throw ArgError(2, e.what());
  } catch (const HookFailed&) {
    failed = true;
  }
  if (failed) return lua_error(L);  // the hook's own error, its position kept
  push_tensor(L, y);
  return 1;
}

// m:hook_points() -> {name, ...}: the block's hook points (host/nn/blocks.h)
int module_hook_points(lua_State* L) {
  auto points = check_native(L, 1)->hook_points();
  lua_createtable(L, static_cast<int>(points.size()), 0);
  for (size_t i = 0; i < points.size(); ++i) {
    lua_pushstring(L, points[i].c_str());
    lua_rawseti(L, -2, static_cast<int>(i + 1));
  }
  return 1;
}

// m:named_parameters() -> {{name, tensor}, ...} in registration order
int module_named_parameters(lua_State* L) {
  NativePtr& b = check_native(L, 1);
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
  check_native(L, 1)->train(opt_boolean(L, 2, true));
  return 0;
}

int module_kind(lua_State* L) {
  lua_pushstring(L, check_native(L, 1)->kind().c_str());
  return 1;
}

int module_describe(lua_State* L) {
  lua_pushstring(L, check_native(L, 1)->describe().c_str());
  return 1;
}

// m:keep_pattern(keep, grad): attention blocks keep their last pattern
int module_keep_pattern(lua_State* L) {
  NativePtr& b = check_native(L, 1);
  b->keep_pattern = opt_boolean(L, 2, true);
  b->pattern_grad = opt_boolean(L, 3, false);
  if (!b->keep_pattern) b->pattern = at::Tensor();
  return 0;
}

// m:takes_cache() -> whether the block takes part in incremental decoding;
// m:set_cache(on): starts (true) or drops (false) its key/value cache
int module_takes_cache(lua_State* L) {
  lua_pushboolean(L, check_native(L, 1)->takes_cache());
  return 1;
}

int module_set_cache(lua_State* L) {
  check_native(L, 1)->set_cache(lua_toboolean(L, 2));
  return 0;
}

// m:takes_mask() -> whether the block reads a padding mask; m:set_mask(mask
// or nil): mask (B, T) bool or int64, true (1) at real tokens
int module_takes_mask(lua_State* L) {
  lua_pushboolean(L, check_native(L, 1)->takes_mask());
  return 1;
}

int module_set_mask(lua_State* L) {
  NativePtr& b = check_native(L, 1);
  if (lua_isnoneornil(L, 2)) {
    b->set_mask(at::Tensor());
    return 0;
  }
  const at::Tensor& mask = check_tensor(L, 2);
  if (mask.dim() != 2 || (mask.scalar_type() != at::kBool && mask.scalar_type() != at::kLong))
    throw ArgError(2, "the attention mask must be (B, T) bool or int64");
  b->set_mask(mask.to(at::kBool));
  return 0;
}

int module_pattern(lua_State* L) {
  push_tensor(L, check_native(L, 1)->pattern);
  return 1;
}

// m:to(device_or_dtype): parameters change in place, so Lua references stay valid
int module_to(lua_State* L) {
  NativePtr& b = check_native(L, 1);
  std::string s = check_string(L, 2);
  if (is_device_name(s)) b->to(parse_device_arg(s, 2));
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
    {"hook_points", guarded<module_hook_points>},
    {"pattern", guarded<module_pattern>},
    {"takes_cache", guarded<module_takes_cache>},
    {"set_cache", guarded<module_set_cache>},
    {"takes_mask", guarded<module_takes_mask>},
    {"set_mask", guarded<module_set_mask>},
    {"to", guarded<module_to>},
    {nullptr, nullptr},
};

// RoPEAttention(dim, heads, {kv_heads, head_dim, rotary_dim, theta, scaling,
// factor, low_freq_factor, high_freq_factor, original_max_positions,
// qkv_bias, out_bias, causal, sliding_window, scale, softcap, qk_norm,
// qk_norm_eps, qk_norm_offset, interleaved, short_factor, long_factor,
// attention_factor})
int new_rope_attention(lua_State* L) {
  nn::RoPEAttentionOptions o(check_integer(L, 1), check_integer(L, 2));
  if (auto v = option<int64_t>(L, 3, "kv_heads")) o.kv_heads(*v);
  if (auto v = option<int64_t>(L, 3, "head_dim")) o.head_dim(*v);
  if (auto v = option<int64_t>(L, 3, "rotary_dim")) o.rotary_dim(*v);
  if (auto v = option<double>(L, 3, "theta")) o.theta(*v);
  if (auto v = option<std::string>(L, 3, "scaling")) o.scaling(*v);
  if (auto v = option<double>(L, 3, "factor")) o.factor(*v);
  if (auto v = option<double>(L, 3, "low_freq_factor")) o.low_freq_factor(*v);
  if (auto v = option<double>(L, 3, "high_freq_factor")) o.high_freq_factor(*v);
  if (auto v = option<int64_t>(L, 3, "original_max_positions")) o.original_max_positions(*v);
  if (auto v = option<bool>(L, 3, "qkv_bias")) o.qkv_bias(*v);
  if (auto v = option<bool>(L, 3, "out_bias")) o.out_bias(*v);
  if (auto v = option<bool>(L, 3, "causal")) o.causal(*v);
  if (auto v = option<int64_t>(L, 3, "sliding_window")) o.sliding_window(*v);
  if (auto v = option<double>(L, 3, "scale")) o.scale(*v);
  if (auto v = option<double>(L, 3, "softcap")) o.softcap(*v);
  if (auto v = option<std::string>(L, 3, "qk_norm")) o.qk_norm(*v);
  if (auto v = option<double>(L, 3, "qk_norm_eps")) o.qk_norm_eps(*v);
  if (auto v = option<double>(L, 3, "qk_norm_offset")) o.qk_norm_offset(*v);
  if (auto v = option<bool>(L, 3, "interleaved")) o.interleaved(*v);
  if (auto v = option<std::vector<double>>(L, 3, "short_factor")) o.short_factor(*v);
  if (auto v = option<std::vector<double>>(L, 3, "long_factor")) o.long_factor(*v);
  if (auto v = option<double>(L, 3, "attention_factor")) o.attention_factor(*v);
  push_new(L, 3, {{"dim", 1}, {"heads", 2}}, [&] { return std::make_shared<nn::RoPEAttention>(o); });
  return 1;
}

// SwiGLU(dim, hidden, {bias, activation = 'silu'})
int new_swiglu(lua_State* L) {
  nn::SwiGLUOptions o(check_integer(L, 1), check_integer(L, 2));
  if (auto v = option<bool>(L, 3, "bias")) o.bias(*v);
  if (auto v = option<std::string>(L, 3, "activation")) o.activation(*v);
  push_new(L, 3, {{"dim", 1}, {"hidden", 2}}, [&] { return std::make_shared<nn::SwiGLU>(o); });
  return 1;
}

// fn(...) with a Guard (host/runtime.h) alive on this thread for the call:
// torch._native.with_trusted_ids (TrustedIds: GPU ids are not read back to be
// checked) and torch._native.without_init (SkipInit: blocks built inside draw
// no initial values).
template <typename Guard>
int with_guard(lua_State* L) {
  if (lua_type(L, 1) != LUA_TFUNCTION) throw ArgError(1, "function expected, got " + type_name(L, 1));
  int status;
  {
    Guard guard;
    status = lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0);
  }
  if (status != 0) return lua_error(L);
  return lua_gettop(L);
}

const luaL_Reg module_constructors[] = {
    {"with_trusted_ids", guarded<with_guard<TrustedIds>>},
    {"without_init", guarded<with_guard<SkipInit>>},
    {"Linear", guarded<new_linear>},
    {"Embedding", guarded<new_embedding>},
    {"LayerNorm", guarded<new_layer_norm>},
    {"RMSNorm", guarded<new_rms_norm>},
    {"Activation", guarded<new_activation>},
    {"Dropout", guarded<new_dropout>},
    {"Attention", guarded<new_attention>},
    {"VibeAttention", guarded<new_vibe_attention>},
    {"MLP", guarded<new_mlp>},
    {"RoPEAttention", guarded<new_rope_attention>},
    {"SwiGLU", guarded<new_swiglu>},
    {nullptr, nullptr},
};

}  // namespace

// Pushes the table of native block constructors (torch._native).
int luaopen_anatomy_blocks(lua_State* L) {
  define_userdata<NativePtr>(L, kNativeMeta, "Native", module_methods);
  lua_newtable(L);
  luaL_register(L, nullptr, module_constructors);
  return 1;
}

}  // namespace anatomy::lua
