// Inside bindings/: the entry points of the binding files, from which the
// torch module is assembled (the embedding sees only bindings.h).
#pragma once
#include <ATen/core/Tensor.h>
#include <lua.hpp>

#include <memory>
#include <vector>

namespace anatomy::io {
class BpeTokenizer;
}

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
int luaopen_anatomy_blocks(lua_State* L);
/// Adds no_grad, enable_grad, is_grad_enabled, set_grad_enabled, autocast and is_autocast_enabled to the torch table at index torch (grad_mode.cpp).
void register_grad_mode(lua_State* L, int torch);
/// Adds get_rng_state and set_rng_state to the torch table at index torch (random.cpp).
void register_random(lua_State* L, int torch);
/// Adds _cross_entropy to the torch table at index torch (loss.cpp).
void register_loss(lua_State* L, int torch);
/// Adds _now, _isatty, _not_a_file, _compressed_size, _cache_dir, _write_atomic, _sync_file and _remove_stale_temporaries to the torch table at index torch (system.cpp).
void register_system(lua_State* L, int torch);
/// Adds _http, _symlink, _readlink, _hardlink, _lock, _file_digest, _file_size, _lstat_kind, _realpath, _mkdir and _list_dir to the torch table at index torch (http.cpp).
void register_http(lua_State* L, int torch);
/// Adds torch.linalg to the torch table at index torch (linalg.cpp).
void register_linalg(lua_State* L, int torch);
/// Pushes torch.metrics, the autopsy's measurement kernels.
int luaopen_anatomy_metrics(lua_State* L);
/// Pushes torch.cuda (availability, synchronize, memory counters, CUDAGraph).
int luaopen_anatomy_cuda(lua_State* L);
/// Pushes torch.profiler (count_ops).
int luaopen_anatomy_profiler(lua_State* L);
/// Pushes torch._dist, the native half of `dist` (dist.cpp).
int luaopen_anatomy_dist(lua_State* L);
/// Pushes the table of optimizer constructors (torch._optim).
int luaopen_anatomy_optim(lua_State* L);
/// Pushes the table of corpus constructors (torch._data).
int luaopen_anatomy_corpus(lua_State* L);
/// Adds the byte-level BPE loaders (_bpe_from_json, _bpe_from_vocab_merges) to torch._data at idx.
void register_tokenizer(lua_State* L, int data);
/// The BPE tokenizer userdata at idx, or nullptr when idx holds something else.
std::shared_ptr<io::BpeTokenizer> to_bpe_tokenizer(lua_State* L, int idx);
/// Pushes torch._exact: the Rational type (GMP) and certified bounds.
int luaopen_anatomy_rational(lua_State* L);
/// Adds save_safetensors and load_safetensors to the torch table on the stack top.
void register_safetensors(lua_State* L, int torch);
/// Adds _load_npz and _save_npz to the torch table at index torch (npz.cpp).
void register_npz(lua_State* L, int torch);
/// Adds _yaml_decode to the torch table at index torch (yaml.cpp).
void register_yaml(lua_State* L, int torch);
/// Pushes a Lua array of tensors.
void push_tensor_table(lua_State* L, const std::vector<at::Tensor>& ts);
/// Reads a Lua array of tensors at idx (argument `arg` for errors).
std::vector<at::Tensor> check_tensor_table(lua_State* L, int idx);
/// Lua state used by gradient hooks while backward() runs.
void set_hook_state(lua_State* L);
/// Marks the Lua state as closing: hooks still held by tensors stop using it.
void close_hook_state();

}  // namespace anatomy::lua
