// The bindings as the embedding sees them: one call opens them in a Lua
// state (require 'anatomy.core' then builds the native half of `torch`),
// one closes them before the state goes. embed/ includes only this.
#pragma once

struct lua_State;

namespace anatomy::lua {

/// Makes `require 'anatomy.core'` load the bindings in L, and lets gradient
/// hooks and Ctrl-C reach L. Call once, right after the state is created.
void open(lua_State* L);
/// Detaches the bindings from L: hooks still held by tensors stop calling
/// into it, and cached addresses are forgotten. Call before lua_close(L).
void close(lua_State* L);

}  // namespace anatomy::lua
