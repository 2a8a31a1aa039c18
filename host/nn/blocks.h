// Built-in blocks: LibTorch modules whose forward maps one tensor to one.
// Lua wraps them (lua/anatomy/nn/Native.lua and one file per block) so that
// they follow the same module protocol as blocks written in Lua. Parameter
// names are PyTorch's (weight, bias; a Linear weight is [out, in]) so state
// dicts move unchanged. Each block takes an options struct, as PyTorch's
// torch::nn modules do (nn/options/); its constructor checks every value once.
#pragma once
#include <torch/arg.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace anatomy::nn {

/// A bad input to a block's forward (wrong rank, size or dtype).
struct InputError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

/// A bad setting given to a block's constructor; `field` names the option.
struct OptionError : std::invalid_argument {
  OptionError(std::string field, const std::string& message) : std::invalid_argument(message), field(std::move(field)) {}
  std::string field;
};

struct LinearOptions {
  LinearOptions(int64_t in_features, int64_t out_features) : in_features_(in_features), out_features_(out_features) {}
  /// input size, >= 1
  TORCH_ARG(int64_t, in_features);
  /// output size, >= 1
  TORCH_ARG(int64_t, out_features);
  /// whether to learn an additive bias
  TORCH_ARG(bool, bias) = true;
};

struct EmbeddingOptions {
  EmbeddingOptions(int64_t num_embeddings, int64_t embedding_dim)
      : num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {}
  /// vocabulary size (ids 1..num_embeddings), >= 1
  TORCH_ARG(int64_t, num_embeddings);
  /// vector size, >= 1
  TORCH_ARG(int64_t, embedding_dim);
  /// length of a learned position table added to the embeddings; 0 for none
  TORCH_ARG(int64_t, positions) = 0;
};

struct NormOptions {
  NormOptions(int64_t dim, double eps) : dim_(dim), eps_(eps) {}
  /// size of the last dimension, >= 1
  TORCH_ARG(int64_t, dim);
  /// added to the variance (or mean square) before the square root, > 0
  TORCH_ARG(double, eps);
  /// RMSNorm: scale by weight + offset (Gemma's norms: 1, the checkpoint holding weight - 1)
  TORCH_ARG(double, offset) = 0.0;
};

struct AttentionOptions {
  AttentionOptions(int64_t dim, int64_t heads) : dim_(dim), heads_(heads) {}
  /// model width C, divisible by heads
  TORCH_ARG(int64_t, dim);
  /// number of heads, >= 1
  TORCH_ARG(int64_t, heads);
  /// mask future positions
  TORCH_ARG(bool, causal) = true;
  /// biases in the qkv and output projections
  TORCH_ARG(bool, bias) = true;
};

struct MLPOptions {
  MLPOptions(int64_t dim, int64_t hidden) : dim_(dim), hidden_(hidden) {}
  /// input and output size, >= 1
  TORCH_ARG(int64_t, dim);
  /// hidden size, >= 1
  TORCH_ARG(int64_t, hidden);
  /// "gelu", "gelu_tanh" or "relu"
  TORCH_ARG(std::string, activation) = "gelu";
  /// biases in fc and proj
  TORCH_ARG(bool, bias) = true;
};

struct RoPEAttentionOptions {
  RoPEAttentionOptions(int64_t dim, int64_t heads) : dim_(dim), heads_(heads), kv_heads_(heads) {}
  /// model width C (input and output), >= 1
  TORCH_ARG(int64_t, dim);
  /// query heads H, >= 1
  TORCH_ARG(int64_t, heads);
  /// key/value heads, dividing heads (grouped-query attention; 1: multi-query)
  TORCH_ARG(int64_t, kv_heads);
  /// size of each head; 0: dim / heads
  TORCH_ARG(int64_t, head_dim) = 0;
  /// the leading dims of each head that rotate (even); 0: all of them (partial rotary below head_dim)
  TORCH_ARG(int64_t, rotary_dim) = 0;
  /// RoPE's base (rope_theta)
  TORCH_ARG(double, theta) = 10000.0;
  /// "default", "linear" (positions / factor) or "llama3" (Llama 3.1's frequency bands)
  TORCH_ARG(std::string, scaling) = "default";
  /// scaling factor ("linear", "llama3")
  TORCH_ARG(double, factor) = 1.0;
  /// "llama3": low_freq_factor, high_freq_factor, original_max_position_embeddings
  TORCH_ARG(double, low_freq_factor) = 1.0;
  TORCH_ARG(double, high_freq_factor) = 4.0;
  TORCH_ARG(int64_t, original_max_positions) = 8192;
  /// biases in the q, k, v projections (Qwen2, GPT-NeoX) and in the output one (GPT-NeoX)
  TORCH_ARG(bool, qkv_bias) = false;
  TORCH_ARG(bool, out_bias) = false;
  TORCH_ARG(bool, causal) = true;
  /// attend to at most this many positions back, the current one included (Mistral); 0: no limit
  TORCH_ARG(int64_t, sliding_window) = 0;
  /// the scores' factor; 0: 1/√head_dim (Gemma: query_pre_attn_scalar^-1/2)
  TORCH_ARG(double, scale) = 0.0;
  /// attention-logit soft-capping, scores = softcap·tanh(scores/softcap) (Gemma 2); 0: none
  TORCH_ARG(double, softcap) = 0.0;
  /// RMSNorm on queries and keys after the projections: "none", "head" (over each head's dims:
  /// Qwen3, Gemma 3) or "proj" (over the whole projection: OLMo 2, OLMoE); children q_norm, k_norm
  TORCH_ARG(std::string, qk_norm) = "none";
  TORCH_ARG(double, qk_norm_eps) = 1e-6;
  /// the norms' offset (Gemma 3: 1, see NormOptions)
  TORCH_ARG(double, qk_norm_offset) = 0.0;
  /// rotate the pairs (2i, 2i+1) rather than (i, i + rotary_dim/2) (GPT-J)
  TORCH_ARG(bool, interleaved) = false;
  /// "longrope" (Phi-3): the frequencies divided by short_factor, or by long_factor when a
  /// forward's last position is past original_max_positions; rotary_dim/2 numbers each
  TORCH_ARG(std::vector<double>, short_factor);
  TORCH_ARG(std::vector<double>, long_factor);
  /// cos and sin multiplied by this (longrope's attention factor)
  TORCH_ARG(double, attention_factor) = 1.0;
};

struct SwiGLUOptions {
  SwiGLUOptions(int64_t dim, int64_t hidden) : dim_(dim), hidden_(hidden) {}
  /// input and output size, >= 1
  TORCH_ARG(int64_t, dim);
  /// hidden size, >= 1
  TORCH_ARG(int64_t, hidden);
  /// biases in gate, up and down
  TORCH_ARG(bool, bias) = false;
  /// the gate's activation: "silu" (Llama's SwiGLU), "gelu_tanh" (Gemma's GeGLU) or "gelu"
  TORCH_ARG(std::string, activation) = "silu";
};

class Native : public torch::nn::Module {
 public:
  virtual at::Tensor forward(const at::Tensor& x) = 0;
  /// The class name without "nn.": "Linear", "Attention", ...
  virtual std::string kind() const = 0;
  /// The constructor arguments as tostring shows them: "64 -> 192, bias=true".
  virtual std::string describe() const = 0;

  /// Attention blocks keep their last attention matrix (B, H, T, T) here when
  /// keep_pattern is set; attached to the graph only if pattern_grad is set.
  bool keep_pattern = false;
  bool pattern_grad = false;
  at::Tensor pattern;

  /// Hook points inside the block ("q", "pattern", "post", "scale", ...;
  /// hook_points() lists them). While `hook` is set, forward takes its
  /// explicit path and passes each intermediate through hook(name, t), going
  /// on with what it returns (t itself, or a replacement of the same shape).
  /// Unset, forward is unchanged: no hook costs anything.
  using HookFn = std::function<at::Tensor(const char* name, const at::Tensor& t)>;
  HookFn hook;
  /// Points that cost extra to compute (an attention's per-head "result",
  /// B x T x H x C) are computed only while listed here.
  std::vector<std::string> wanted;
  /// The block's hook points, in the order forward reaches them.
  virtual std::vector<std::string> hook_points() const { return {}; }

  /// Incremental decoding (generation with a key/value cache). A block that
  /// takes part overrides both: set_cache(true) starts an empty cache,
  /// set_cache(false) drops it; while it is on, forward(x) reads x as the
  /// positions after those it has already seen (attention keeps their keys
  /// and values and attends to them too; a position table goes on counting).
  virtual bool takes_cache() const { return false; }
  virtual void set_cache(bool on) { (void)on; }

  /// Padding: mask (B, T) bool, true at real tokens and false at padding, or
  /// undefined for none. A block that takes it overrides both: attention
  /// attends to no padded key, and positions count real tokens only (left
  /// padding moves none). While caching, it covers the cached positions and
  /// the new ones.
  virtual bool takes_mask() const { return false; }
  virtual void set_mask(const at::Tensor& mask) { (void)mask; }

 protected:
  /// t through the hook (t itself when none is set).
  at::Tensor at_hook(const char* name, const at::Tensor& t) const { return hook ? hook(name, t) : t; }
  bool wants(const char* name) const;
};

/// y = x Wᵀ + b. weight [out, in], bias [out]; PyTorch's uniform(±1/√in) init.
class Linear : public Native {
 public:
  explicit Linear(const LinearOptions& options);
  at::Tensor forward(const at::Tensor& x) override;
  std::string kind() const override { return "Linear"; }
  std::string describe() const override;
  int64_t in_features, out_features;
  at::Tensor weight, bias;
};

/// Token embedding (1-based ids, int64) plus an optional learned position
/// table: weight [n, dim], pos_weight [positions, dim]; N(0, 1) init.
class Embedding : public Native {
 public:
  explicit Embedding(const EmbeddingOptions& options);
  at::Tensor forward(const at::Tensor& ids) override;
  std::string kind() const override { return "Embedding"; }
  std::string describe() const override;
  bool takes_cache() const override { return true; }
  void set_cache(bool on) override { caching = on, past = 0; }
  bool takes_mask() const override { return true; }
  void set_mask(const at::Tensor& mask) override { pad_mask = mask; }
  int64_t num_embeddings, embedding_dim, positions;
  at::Tensor weight, pos_weight;

 private:
  bool caching = false;
  int64_t past = 0;  // positions seen while caching
  at::Tensor pad_mask;
};

/// LayerNorm over the last dimension with learnable weight and bias.
class LayerNorm : public Native {
 public:
  explicit LayerNorm(const NormOptions& options);
  at::Tensor forward(const at::Tensor& x) override;
  std::string kind() const override { return "LayerNorm"; }
  std::string describe() const override;
  std::vector<std::string> hook_points() const override { return {"scale", "normalized"}; }
  int64_t dim;
  double eps;
  at::Tensor weight, bias;
};

/// RMSNorm: x / √(mean(x²) + eps) · weight, over the last dimension.
class RMSNorm : public Native {
 public:
  explicit RMSNorm(const NormOptions& options);
  at::Tensor forward(const at::Tensor& x) override;
  std::string kind() const override { return "RMSNorm"; }
  std::string describe() const override;
  std::vector<std::string> hook_points() const override { return {"scale", "normalized"}; }
  int64_t dim;
  double eps, offset;
  at::Tensor weight;
};

/// An activation or dropout: no parameters.
class Activation : public Native {
 public:
  /// name: "gelu", "gelu_tanh", "relu" (else OptionError)
  explicit Activation(std::string name);
  at::Tensor forward(const at::Tensor& x) override;
  /// The activation `name` applied to x (MLP's hidden layer uses it too).
  static at::Tensor apply(const std::string& name, const at::Tensor& x);
  std::string kind() const override;
  std::string describe() const override;
  std::string name;
};

class Dropout : public Native {
 public:
  explicit Dropout(double p);
  at::Tensor forward(const at::Tensor& x) override;
  std::string kind() const override { return "Dropout"; }
  std::string describe() const override;
  double p;
};

/// How AttentionBase::attend masks and normalises.
struct AttendOptions {
  /// the scores' factor; 0: 1/√D
  TORCH_ARG(double, scale) = 0.0;
  /// scores = softcap·tanh(scores/softcap) before the mask; 0: none
  TORCH_ARG(double, softcap) = 0.0;
  /// a query sees no later key
  TORCH_ARG(bool, causal) = true;
  /// nor one this many positions back or more (0: no limit)
  TORCH_ARG(int64_t, window) = 0;
  /// softmax in float32, the pattern then in this dtype (the input's, as transformers' Llama does);
  /// Undefined: softmax in the scores' dtype (as its GPT-2 does)
  TORCH_ARG(at::ScalarType, float_softmax) = at::ScalarType::Undefined;
};

/// What Attention and RoPEAttention share: the key/value cache, the padding
/// mask, and attend(), the tail from q, k, v to the output projection that
/// passes scores, pattern, z and each head's result through the hook.
class AttentionBase : public Native {
 public:
  bool takes_cache() const override { return true; }
  void set_cache(bool on) override { caching = on, past_k = at::Tensor(), past_v = at::Tensor(); }
  bool takes_mask() const override { return true; }
  void set_mask(const at::Tensor& mask) override { pad_mask = mask; }

 protected:
  /// t (B, T, H·D) as heads (B, T, H, D) through the hook, then (B, H, T, D).
  at::Tensor split_heads(const char* name, const at::Tensor& t, int64_t H) const;
  /// Positions seen before this forward's while caching.
  int64_t past() const { return caching && past_k.defined() ? past_k.size(2) : 0; }
  /// The padding mask, checked against the Tk positions it must cover.
  const at::Tensor& padding(int64_t B, int64_t Tk) const;
  /// softmax(q kᵀ·scale (1/√D unless set), soft-capped, masked) v through `out` (B, T, C): q (B, H, T, D) holds
  /// the last T of the Tk positions of k and v (B, H, Tk, D).
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Linear& out, const AttendOptions& how);
  bool caching = false;
  at::Tensor past_k, past_v;  // (B, heads, past, D) while caching
  at::Tensor pad_mask;        // (B, past + T) while set

 private:
  at::Tensor blocked_;  // the mask over T positions for the last length and device seen
};

/// Multi-head attention with a fused QKV projection and an output projection:
/// children qkv (dim -> 3·dim; q, k, v in that order) and proj (dim -> dim).
/// Input (B, T, C); scores scaled by 1/√(C/heads); causal mask optional.
class Attention : public AttentionBase {
 public:
  explicit Attention(const AttentionOptions& options);
  at::Tensor forward(const at::Tensor& x) override;
  std::string kind() const override { return "Attention"; }
  std::string describe() const override;
  std::vector<std::string> hook_points() const override { return {"q", "k", "v", "scores", "pattern", "z", "result"}; }
  int64_t dim, heads;
  bool causal;
  std::shared_ptr<Linear> qkv, proj;
};

/// Parameter-free attention: softmax(mask(x xᵀ / √C)) x. One head.
class VibeAttention : public Native {
 public:
  explicit VibeAttention(bool causal);
  at::Tensor forward(const at::Tensor& x) override;
  std::string kind() const override { return "VibeAttention"; }
  std::string describe() const override;
  std::vector<std::string> hook_points() const override { return {"scores", "pattern", "z"}; }
  bool causal;

 private:
  at::Tensor mask_;  // the causal mask for the last length seen
};

/// Self-attention with rotary position embeddings (RoPE) as Llama, Mistral,
/// Qwen2 and GPT-NeoX use it: q, k, v and o projections; keys and values
/// shared by groups of query heads (kv_heads); the first rotary_dim dims of
/// each head rotated by position, the pairs being (i, i + rotary_dim/2).
class RoPEAttention : public AttentionBase {
 public:
  explicit RoPEAttention(const RoPEAttentionOptions& options);
  at::Tensor forward(const at::Tensor& x) override;
  std::string kind() const override { return "RoPEAttention"; }
  std::string describe() const override;
  std::vector<std::string> hook_points() const override { return {"q", "k", "v", "q_normed", "k_normed", "rot_q", "rot_k", "scores", "pattern", "z", "result"}; }
  RoPEAttentionOptions options;
  int64_t head_dim, rotary_dim;
  std::shared_ptr<Linear> q, k, v, o;
  /// with qk_norm: the norms of queries and keys (over head_dim, or the whole projection)
  std::shared_ptr<RMSNorm> q_norm, k_norm;
  /// the rotation frequencies (rotary_dim / 2), float64 on the CPU; longrope's past
  /// original_max_positions in inv_freq_long
  at::Tensor inv_freq, inv_freq_long;

 private:
  std::pair<at::Tensor, at::Tensor> angles(const at::Tensor& x);
  at::Tensor rotate(const char* name, const at::Tensor& t, const at::Tensor& cos, const at::Tensor& sin) const;
  at::Tensor norm(const char* name, const std::shared_ptr<RMSNorm>& n, const at::Tensor& t) const;
  at::Tensor shared(const at::Tensor& kv) const;
  at::Tensor cos_, sin_;  // for the last length, device and dtype seen
};

/// SwiGLU MLP (Llama): down(silu(gate(x)) * up(x)).
class SwiGLU : public Native {
 public:
  explicit SwiGLU(const SwiGLUOptions& options);
  at::Tensor forward(const at::Tensor& x) override;
  std::string kind() const override { return "SwiGLU"; }
  std::string describe() const override;
  std::vector<std::string> hook_points() const override { return {"pre", "pre_linear", "post"}; }
  int64_t dim, hidden;
  std::string activation;
  std::shared_ptr<Linear> gate, up, down;
};

/// fc (dim -> hidden), activation, proj (hidden -> dim).
class MLP : public Native {
 public:
  explicit MLP(const MLPOptions& options);
  at::Tensor forward(const at::Tensor& x) override;
  std::string kind() const override { return "MLP"; }
  std::string describe() const override;
  std::vector<std::string> hook_points() const override { return {"pre", "post"}; }
  int64_t dim, hidden;
  std::string activation;
  std::shared_ptr<Linear> fc, proj;
};

}  // namespace anatomy::nn
