// Entry points of the binding files: the torch module and the pieces it is
// assembled from.
#pragma once
#include <ATen/core/Tensor.h>
#include <lua.hpp>

#include <vector>

namespace anatomy::lua {

/// Pushes the `torch` table (the native half; lua/anatomy/init.lua adds the rest).
int luaopen_anatomy_core(lua_State* L);
/// Pushes the methods table (torch.Tensor) after creating the metatable.
int luaopen_anatomy_tensor(lua_State* L);
/// Adds size, view, reshape, permute, narrow, split, ... to the methods table at idx.
void register_tensor_shape(lua_State* L, int methods);
/// Adds elementwise math, products and comparisons to the methods table at idx.
void register_tensor_math(lua_State* L, int methods);
/// Adds reductions, index-tensor selection and in-place fills to the methods table at idx.
void register_tensor_reduce(lua_State* L, int methods);
/// Adds backward, hooks, detach, ... to the methods table at idx.
void register_tensor_autograd(lua_State* L, int methods);
/// Pushes the table of built-in block constructors (torch._native).
int luaopen_anatomy_module(lua_State* L);
/// Adds torch.linalg, the RNG state, the cross-entropy and clock/terminal/zlib services to the table at idx.
void register_torch_util(lua_State* L, int torch);
/// Pushes torch.metrics, the autopsy's measurement kernels.
int luaopen_anatomy_metrics(lua_State* L);
/// Pushes the table of optimizer constructors (torch._optim).
int luaopen_anatomy_optim(lua_State* L);
/// Pushes the table of corpus constructors (torch._data).
int luaopen_anatomy_corpus(lua_State* L);
/// Pushes torch._exact: the Rational type (GMP) and certified bounds.
int luaopen_anatomy_exact(lua_State* L);
/// Adds save_safetensors and load_safetensors to the torch table on the stack top.
void register_safetensors(lua_State* L, int torch);
/// Pushes a Lua array of tensors.
void push_tensor_table(lua_State* L, const std::vector<at::Tensor>& ts);
/// Reads a Lua array of tensors at idx (argument `arg` for errors).
std::vector<at::Tensor> check_tensor_table(lua_State* L, int idx);
/// Lua state used by gradient hooks while backward() runs.
void set_hook_state(lua_State* L);
/// Marks the Lua state as closing: hooks still held by tensors stop using it.
void close_hook_state();

}  // namespace anatomy::lua
