// What every binding file shares: the Tensor userdata, argument checks, the
// 1-based index helper, and the wrapper that turns C++ exceptions into Lua
// errors. Only bindings/ includes this.
#pragma once
#include <ATen/core/Tensor.h>
#include <lua.hpp>

#include "bindings/interrupt.h"

#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace anatomy::lua {

constexpr const char* kTensorMeta = "anatomy.Tensor";

/// A bad argument: raised as Lua's "bad argument #arg to 'f' (message)".
struct ArgError : std::runtime_error {
  int arg;
  ArgError(int arg, const std::string& message) : std::runtime_error(message), arg(arg) {}
};

/// An error about the call as a whole, raised with the caller's position.
struct CallError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Raises the Lua error for an exception caught by guarded(); the message is on
// the stack top. kind: 1 ArgError, 2 CallError, 3 anything else.
int raise_error(lua_State* L, int kind, int arg);

/// Wraps a binding body: exceptions become Lua errors, raised after the catch
/// block (a Lua error unwinds the C++ stack; it must not start inside a catch).
/// Never catch (...): it would swallow LuaJIT's own error unwinding.
template <lua_CFunction F>
int guarded(lua_State* L) {
  int kind = 0, arg = 0;
  try {
    if (interrupt::pending) interrupt::raise();  // Ctrl-C (bindings/interrupt.h)
    return F(L);
  } catch (const ArgError& e) {
    kind = 1;
    arg = e.arg;
    lua_pushstring(L, e.what());
  } catch (const CallError& e) {
    kind = 2;
    lua_pushstring(L, e.what());
  } catch (const c10::Error& e) {
    kind = 3;
    lua_pushstring(L, e.what_without_backtrace());
  } catch (const std::exception& e) {
    kind = 3;
    lua_pushstring(L, e.what());
  }
  return raise_error(L, kind, arg);
}

// ---- tensors --------------------------------------------------------------

/// The tensor at stack index idx, or ArgError "Tensor expected, got X".
at::Tensor& check_tensor(lua_State* L, int idx);
/// Registry key (light userdata) of the tensor metatable.
extern char g_tensor_meta_key;
/// Drops the cached metatable address (called when a Lua state closes).
void forget_tensor_metatable();
/// The tensor at idx, or nullptr if the value is not a tensor.
at::Tensor* to_tensor(lua_State* L, int idx);
/// Pushes sizes (or strides) as a Lua array.
void push_sizes(lua_State* L, at::IntArrayRef sizes);
/// Pushes the metatable of sizes (torch.Size: prints {2, 3}), made on first use.
void push_size_metatable(lua_State* L);
/// Pushes a tensor (nil if undefined).
void push_tensor(lua_State* L, at::Tensor t);
/// For `a op b` with the operands at stack 1 and 2 (tensors or numbers):
/// pushes the result and returns true when it is computed without the
/// dispatcher (host/small_arith.h: op '+', '-', '*' or '/', small plain
/// tensors, no autograd); false, with nothing pushed, otherwise.
bool push_small_arith(lua_State* L, char op);
/// A Lua number as a Scalar: integral values become integers, so that an int
/// tensor times 2 stays int (as 2 is a Python int in PyTorch), while x * 0.5 is float.
at::Scalar number_scalar(double v);
/// A tensor from a tensor or a number at idx (numbers become 0-dim wrapped
/// scalars, which keep the other operand's dtype as in PyTorch).
at::Tensor tensor_or_scalar(lua_State* L, int idx, const char* expected = "Tensor or number");

/// True when two shapes broadcast against each other (PyTorch's rules).
bool broadcastable(at::IntArrayRef a, at::IntArrayRef b);

/// ArgError "shapes AxB and C cannot be broadcast" unless they can.
void check_broadcast(const at::Tensor& a, const at::Tensor& b, int arg);

/// a % b (at::remainder) without the processor's trap: on integers, the
/// smallest value modulo -1 divides with overflow (SIGFPE on x86, which no
/// pcall catches; PyTorch 1.13 dies of it). x mod -1 is 0 for every x, as is
/// x mod 1, so a divisor of -1 is taken as 1; PyTorch 2.x gives the same 0.
at::Tensor remainder(const at::Tensor& a, const at::Tensor& b);

// ---- plain arguments ------------------------------------------------------

int64_t check_integer(lua_State* L, int idx);
double check_number(lua_State* L, int idx);
bool opt_boolean(lua_State* L, int idx, bool fallback);
std::string check_string(lua_State* L, int idx);
/// Lua's type name for the value at idx ("no value" past the top).
std::string type_name(lua_State* L, int idx);
/// True if idx holds a table with string keys only (an options table).
bool is_options(lua_State* L, int idx);
/// Reads the options table at idx; any key not in `allowed` is an ArgError.
void check_option_keys(lua_State* L, int idx, const std::vector<const char*>& allowed);
/// Field `key` of the options table at idx (nil if idx is not a table).
/// Leaves the value on the stack; returns its Lua type.
int get_option(lua_State* L, int idx, const char* key);
/// read() of the value of option `key` (on the stack top, from get_option):
/// an ArgError it raises about that stack slot becomes one about the options
/// table's own argument idx, naming the option (x:sum({dim = 3}) is argument
/// #1's option 'dim', not an argument #2 the caller never wrote).
template <class F>
auto read_option(int idx, const char* key, F&& read) -> decltype(read()) {
  try {
    return read();
  } catch (const ArgError& e) {
    throw ArgError(idx, std::string("option '") + key + "': " + e.what());
  }
}

/// The length of the list at idx; ArgError(arg) naming `what` when it has a
/// hole (a nil before its last entry: {1, nil, 3}).
size_t check_list_length(lua_State* L, int idx, int arg, const char* what);

/// The one way a binding reads a field of an options table: field `key` of
/// the table at idx as T (bool, std::string, double, int64_t or a list of
/// numbers, std::vector<double>), or nothing
/// when the table or the field is absent. A value of another kind is an
/// ArgError about argument idx that names the option ("option 'lr': number
/// expected, got string").
template <class T>
std::optional<T> option(lua_State* L, int idx, const char* key) {
  int type = get_option(L, idx, key);
  std::optional<T> out;
  if (type != LUA_TNIL) {
    out = read_option(idx, key, [&]() -> T {
      if constexpr (std::is_same_v<T, bool>) {
        if (type != LUA_TBOOLEAN) throw ArgError(-1, "true or false expected, got " + type_name(L, -1));
        return lua_toboolean(L, -1) != 0;
      } else if constexpr (std::is_same_v<T, std::string>) {
        return check_string(L, -1);
      } else if constexpr (std::is_same_v<T, int64_t>) {
        return check_integer(L, -1);
      } else if constexpr (std::is_same_v<T, std::vector<double>>) {
        if (type != LUA_TTABLE) throw ArgError(-1, "a list of numbers expected, got " + type_name(L, -1));
        const int list = lua_gettop(L);
        const size_t n = check_list_length(L, list, -1, key);
        T values;
        for (size_t i = 1; i <= n; ++i) {
          lua_rawgeti(L, list, static_cast<int>(i));
          if (lua_type(L, -1) != LUA_TNUMBER)
            throw ArgError(-1, "a list of numbers expected, item " + std::to_string(i) + " is " + type_name(L, -1));
          values.push_back(lua_tonumber(L, -1));
          lua_pop(L, 1);
        }
        return values;
      } else {
        static_assert(std::is_same_v<T, double>, "option<T>: T is bool, std::string, int64_t, double or std::vector<double>");
        return check_number(L, -1);
      }
    });
  }
  lua_pop(L, 1);
  return out;
}

/// Token ids at idx: an integer tensor of any shape (flattened) or a Lua array.
std::vector<int64_t> check_token_ids(lua_State* L, int idx);
/// Sizes from numbers at start.. (stopping at a non-number) or one table.
std::vector<int64_t> check_sizes(lua_State* L, int start, int* next = nullptr);
/// dtype from its name ("float32", "float", "int64", "long", ...).
c10::ScalarType parse_dtype(const std::string& name, int arg);
c10::Device parse_device_arg(const std::string& name, int arg);

/// Factory options: {dtype=, device=, requires_grad=} at idx (may be absent).
struct FactoryOptions {
  at::TensorOptions options;
  bool requires_grad = false;
};
FactoryOptions check_factory_options(lua_State* L, int idx, c10::ScalarType default_dtype = at::kFloat);

// ---- result tables -----------------------------------------------------------

/// t[key] = value, for the table t on the stack top.
inline void set_number_field(lua_State* L, const char* key, double value) {
  lua_pushnumber(L, value);
  lua_setfield(L, -2, key);
}
inline void set_boolean_field(lua_State* L, const char* key, bool value) {
  lua_pushboolean(L, value);
  lua_setfield(L, -2, key);
}
inline void set_string_field(lua_State* L, const char* key, const std::string& value) {
  lua_pushlstring(L, value.data(), value.size());
  lua_setfield(L, -2, key);
}

// ---- other userdata types ----------------------------------------------------
//
// A Lua-visible C++ object (a corpus, a block, an optimizer) is userdata
// holding a T by value (a smart pointer); __gc runs its destructor and the
// metatable is protected, as for tensors.

/// The T inside userdata of metatable `meta` at idx, or ArgError "<what> expected, got X".
template <typename T>
T& check_userdata(lua_State* L, int idx, const char* meta, const char* what) {
  void* p = luaL_testudata(L, idx, meta);
  if (!p) throw ArgError(idx, std::string(what) + " expected, got " + type_name(L, idx));
  return *static_cast<T*>(p);
}

/// Pushes userdata holding `value`, with metatable `meta`.
template <typename T>
void push_userdata(lua_State* L, const char* meta, T value) {
  void* p = lua_newuserdata(L, sizeof(T));
  new (p) T(std::move(value));
  luaL_getmetatable(L, meta);
  lua_setmetatable(L, -2);
}

/// Creates the metatable `meta` for userdata holding a T: __gc, __metatable
/// (getmetatable gives `shown`), and __index = the methods.
template <typename T>
void define_userdata(lua_State* L, const char* meta, const char* shown, const luaL_Reg* methods) {
  luaL_newmetatable(L, meta);
  // The collector calls __gc once; debug.getmetatable(u).__gc(v) may call it
  // with anything, again: only userdata of this metatable is freed, and then
  // loses its metatable (a later use is a type error, not a use after free).
  lua_pushstring(L, meta);
  lua_pushcclosure(L, [](lua_State* S) -> int {
    void* p = luaL_testudata(S, 1, lua_tostring(S, lua_upvalueindex(1)));
    if (!p) return 0;
    static_cast<T*>(p)->~T();
    lua_pushnil(S);
    lua_setmetatable(S, 1);
    return 0;
  }, 1);
  lua_setfield(L, -2, "__gc");
  lua_pushstring(L, shown);
  lua_setfield(L, -2, "__metatable");
  lua_newtable(L);
  luaL_register(L, nullptr, methods);
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
}

// ---- 1-based indices and dimensions --------------------------------------
//
// Lua counts from 1, ATen from 0. Every dim and index crosses here and only
// here: 1..n map to 0..n-1, and -n..-1 count from the end (-1 is the last).
// 0 and anything outside the range is an ArgError that states the range.

/// A dimension of a tensor with `ndim` dimensions ("dim" must name a real one).
int64_t wrap_dim(int64_t dim, int64_t ndim, int arg);
/// A position in a dimension of `size` elements.
int64_t wrap_index(int64_t index, int64_t size, int arg, int64_t dim_for_message = -1);
/// Reads a dim argument at idx and wraps it.
int64_t check_dim(lua_State* L, int idx, int64_t ndim);
/// An index tensor (1-based, integer dtype) as ATen's 0-based int64 tensor;
/// its values must lie in 1..size.
at::Tensor zero_based_index(const at::Tensor& index, int64_t size, int arg);

}  // namespace anatomy::lua
