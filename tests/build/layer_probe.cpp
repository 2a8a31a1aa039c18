// Compiled by tests/build/test_layers.sh against each layer's include path: a
// Lua header must be out of reach from host/ (anatomy_host) and within reach
// from bindings/ (anatomy_bindings). Not part of any build.
#include <lua.hpp>

int layer_probe() { return LUA_TNIL; }
