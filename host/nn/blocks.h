// Built-in blocks: LibTorch modules whose forward maps one tensor to one.
// Lua wraps them (lua/anatomy/nn/native.lua) so that they follow the same
// module protocol as blocks written in Lua. Parameter names are PyTorch's
// (weight, bias; a Linear weight is [out, in]) so state dicts move unchanged.
#pragma once
#include <torch/nn/module.h>

#include <memory>
#include <string>

namespace anatomy::nn {

/// A bad input to a block's forward (wrong rank, size or dtype).
struct InputError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

class Block : public torch::nn::Module {
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
};

/// y = x Wᵀ + b. weight [out, in], bias [out]; PyTorch's uniform(±1/√in) init.
class Linear : public Block {
 public:
  Linear(int64_t in, int64_t out, bool bias);
  at::Tensor forward(const at::Tensor& x) override;
  std::string kind() const override { return "Linear"; }
  std::string describe() const override;
  int64_t in_features, out_features;
  at::Tensor weight, bias;
};

/// Token embedding (1-based ids, int64) plus an optional learned position
/// table: weight [n, dim], pos_weight [positions, dim]; N(0, 1) init.
class Embedding : public Block {
 public:
  Embedding(int64_t n, int64_t dim, int64_t positions);
  at::Tensor forward(const at::Tensor& ids) override;
  std::string kind() const override { return "Embedding"; }
  std::string describe() const override;
  int64_t num_embeddings, embedding_dim, positions;
  at::Tensor weight, pos_weight;
};

/// LayerNorm over the last dimension with learnable weight and bias.
class LayerNorm : public Block {
 public:
  LayerNorm(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x) override;
  std::string kind() const override { return "LayerNorm"; }
  std::string describe() const override;
  int64_t dim;
  double eps;
  at::Tensor weight, bias;
};

/// RMSNorm: x / √(mean(x²) + eps) · weight, over the last dimension.
class RMSNorm : public Block {
 public:
  RMSNorm(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x) override;
  std::string kind() const override { return "RMSNorm"; }
  std::string describe() const override;
  int64_t dim;
  double eps;
  at::Tensor weight;
};

/// An activation or dropout: no parameters.
class Activation : public Block {
 public:
  /// name: "gelu", "gelu_tanh", "relu"
  explicit Activation(std::string name);
  at::Tensor forward(const at::Tensor& x) override;
  std::string kind() const override;
  std::string describe() const override;
  std::string name;
};

class Dropout : public Block {
 public:
  explicit Dropout(double p);
  at::Tensor forward(const at::Tensor& x) override;
  std::string kind() const override { return "Dropout"; }
  std::string describe() const override;
  double p;
};

/// Multi-head attention with a fused QKV projection and an output projection:
/// children qkv (dim -> 3·dim; q, k, v in that order) and proj (dim -> dim).
/// Input (B, T, C); scores scaled by 1/√(C/heads); causal mask optional.
class Attention : public Block {
 public:
  Attention(int64_t dim, int64_t heads, bool causal, bool bias);
  at::Tensor forward(const at::Tensor& x) override;
  std::string kind() const override { return "Attention"; }
  std::string describe() const override;
  int64_t dim, heads;
  bool causal;
  std::shared_ptr<Linear> qkv, proj;

 private:
  at::Tensor mask_;  // the causal mask for the last length seen
};

/// Parameter-free attention: softmax(mask(x xᵀ / √C)) x. One head.
class VibeAttention : public Block {
 public:
  explicit VibeAttention(bool causal);
  at::Tensor forward(const at::Tensor& x) override;
  std::string kind() const override { return "VibeAttention"; }
  std::string describe() const override;
  bool causal;

 private:
  at::Tensor mask_;  // the causal mask for the last length seen
};

/// fc (dim -> hidden), activation, proj (hidden -> dim).
class MLP : public Block {
 public:
  MLP(int64_t dim, int64_t hidden, const std::string& activation, bool bias);
  at::Tensor forward(const at::Tensor& x) override;
  std::string kind() const override { return "MLP"; }
  std::string describe() const override;
  int64_t dim, hidden;
  std::string activation;
  std::shared_ptr<Linear> fc, proj;
};

/// The shape of x as "2x3x4", for messages.
std::string shape_of(const at::Tensor& x);

}  // namespace anatomy::nn
