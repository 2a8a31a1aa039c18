// Built-in blocks (see blocks.h): Linear, Embedding, the norms, activations,
// dropout and the MLPs; the attentions are attention.cpp's. Each forward
// checks its input and says what it expected; the arithmetic is ATen's.
#include "host/nn/blocks.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "host/nn/block_helpers.h"
#include "host/runtime.h"
#include "host/torch_compat.h"
#include "host/tensor_format.h"

namespace anatomy::nn {
using namespace detail;



// ---- Linear -----------------------------------------------------------------------

Linear::Linear(const LinearOptions& o) : in_features(o.in_features()), out_features(o.out_features()) {
  require_positive(o.in_features(), "in_features");
  require_positive(o.out_features(), "out_features");
  const int64_t in = in_features, out = out_features;
  const bool has_bias = o.bias();
  double bound = 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(in, 1)));
  weight = register_parameter("weight", init_uniform(at::empty({out, in}, param_options()), bound));
  if (has_bias) bias = register_parameter("bias", init_uniform(at::empty({out}, param_options()), bound));
}

at::Tensor Linear::forward(const at::Tensor& x) {
  require_last_dim(x, in_features, "Linear");
  return at::linear(x, weight, bias);
}

std::string Linear::describe() const {
  return std::to_string(in_features) + " -> " + std::to_string(out_features) + ", bias=" + bool_str(bias.defined());
}

// ---- Embedding --------------------------------------------------------------------

Embedding::Embedding(const EmbeddingOptions& o)
    : num_embeddings(o.num_embeddings()), embedding_dim(o.embedding_dim()), positions(o.positions()) {
  require_positive(o.num_embeddings(), "num_embeddings");
  require_positive(o.embedding_dim(), "embedding_dim");
  if (o.positions() < 0) throw OptionError("positions", "positions must be positive, got " + std::to_string(o.positions()));
  const int64_t n = num_embeddings, dim = embedding_dim, pos = positions;
  weight = register_parameter("weight", init_normal(at::empty({n, dim}, param_options())));
  if (pos > 0) pos_weight = register_parameter("pos_weight", init_normal(at::empty({pos, dim}, param_options())));
}

at::Tensor Embedding::forward(const at::Tensor& ids) {
  if (ids.scalar_type() != at::kLong)
    throw InputError(std::string("Embedding expects int64 token ids, got ") + dtype_name(ids.scalar_type()) +
                     " (use {dtype = 'int64'} or x:long())");
  if (ids.numel() > 0 && !ids.is_meta() && (ids.is_cpu() || !TrustedIds::active())) {  // meta ids have no values to check
    int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
    if (lo < 1 || hi > num_embeddings)
      throw InputError("token id " + std::to_string(lo < 1 ? lo : hi) + " is out of range 1.." +
                       std::to_string(num_embeddings) + " (ids are 1-based)");
  }
  at::Tensor x = at::embedding(weight, ids - 1);
  if (pos_weight.defined()) {
    if (ids.dim() < 1) throw InputError("Embedding with positions expects ids of shape (B, T) or (T)");
    int64_t T = ids.size(-1), first = caching ? past : 0;
    if (first + T > positions)
      throw InputError("sequence length " + std::to_string(first + T) + " exceeds the " + std::to_string(positions) +
                       " learned positions");
    if (pad_mask.defined()) {  // each example's positions count its real tokens
      if (ids.dim() != 2) throw InputError("Embedding with a padding mask expects ids of shape (B, T)");
      check_mask(pad_mask, ids.size(0), first + T, "Embedding");
      x = x + at::embedding(pos_weight, positions_of(pad_mask, T).to(ids.device()));
    } else {
      x = x + pos_weight.narrow(0, first, T);
    }
  }
  if (caching) past += ids.dim() >= 1 ? ids.size(-1) : 0;
  return x;
}

std::string Embedding::describe() const {
  std::string s = std::to_string(num_embeddings) + ", " + std::to_string(embedding_dim);
  if (positions > 0) s += ", positions=" + std::to_string(positions);
  return s;
}

// ---- norms ----------------------------------------------------------------------------

LayerNorm::LayerNorm(const NormOptions& o) : dim(o.dim()), eps(o.eps()) {
  require_positive(dim, "dim");
  require_positive(eps, "eps");
  weight = register_parameter("weight", at::ones({dim}, param_options()));
  bias = register_parameter("bias", at::zeros({dim}, param_options()));
}

at::Tensor LayerNorm::forward(const at::Tensor& x) {
  require_last_dim(x, dim, "LayerNorm");
  if (!hook) return at::layer_norm(x, {dim}, weight, bias, eps);
  // step by step: scale = √(var + eps) (B, T, 1), normalized = (x - mean) / scale
  at::Tensor centered = x - x.mean(-1, /*keepdim=*/true);
  at::Tensor scale = at_hook("scale", (centered.pow(2).mean(-1, /*keepdim=*/true) + eps).sqrt());
  return at_hook("normalized", centered / scale) * weight + bias;
}

std::string LayerNorm::describe() const { return std::to_string(dim) + ", eps=" + number_str(eps); }

RMSNorm::RMSNorm(const NormOptions& o) : dim(o.dim()), eps(o.eps()), offset(o.offset()) {
  require_positive(dim, "dim");
  require_positive(eps, "eps");
  if (!std::isfinite(offset)) throw OptionError("offset", "offset must be a finite number, got " + number_str(offset));
  // weight + offset starts at one
  weight = register_parameter("weight", at::full({dim}, 1.0 - offset, param_options()));
}

at::Tensor RMSNorm::forward(const at::Tensor& x) {
  require_last_dim(x, dim, "RMSNorm");
  const at::ScalarType dtype = x.scalar_type();
  if (dtype != at::kHalf && dtype != at::kBFloat16) {
    const at::Tensor w = offset == 0 ? weight : weight + offset;
    if (!hook) return x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps) * w;
    at::Tensor scale = at_hook("scale", (x.pow(2).mean(-1, /*keepdim=*/true) + eps).sqrt());  // (B, T, 1)
    return at_hook("normalized", x / scale) * w;
  }
  // float16 and bfloat16: normalised in float32 as transformers' norms are, then
  // Llama's x.to(dtype) * weight, or Gemma's (x * (1 + weight)) in float32, then
  // to dtype. The hooks see x's dtype; an identity hook changes nothing.
  const at::Tensor xf = x.to(at::kFloat);
  at::Tensor normalized;
  if (!hook) {
    normalized = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  } else {
    auto through = [&](const char* name, const at::Tensor& f) {
      const at::Tensor h = f.to(dtype), r = at_hook(name, h);
      return r.is_same(h) ? f : r.to(at::kFloat);
    };
    const at::Tensor scale = through("scale", (xf.pow(2).mean(-1, /*keepdim=*/true) + eps).sqrt());
    normalized = through("normalized", xf / scale);
  }
  if (offset == 0) return normalized.to(dtype) * weight;
  return (normalized * (weight.to(at::kFloat) + offset)).to(dtype);
}

std::string RMSNorm::describe() const {
  return std::to_string(dim) + ", eps=" + number_str(eps) + (offset != 0 ? ", offset=" + number_str(offset) : "");
}

// ---- activations and dropout ---------------------------------------------------------

Activation::Activation(std::string n) : name(std::move(n)) {
  if (name != "gelu" && name != "gelu_tanh" && name != "relu")
    throw OptionError("activation", "unknown activation '" + name + "', expected gelu, gelu_tanh or relu");
}

at::Tensor Activation::apply(const std::string& name, const at::Tensor& x) {
  if (name == "relu") return at::relu(x);
  return at::gelu(x, name == "gelu_tanh" ? "tanh" : "none");
}

at::Tensor Activation::forward(const at::Tensor& x) { return apply(name, x); }

std::string Activation::kind() const { return name == "relu" ? "ReLU" : "GELU"; }
std::string Activation::describe() const { return name == "gelu_tanh" ? "approximate='tanh'" : ""; }

Dropout::Dropout(double rate) : p(rate) {
  if (!(p >= 0 && p < 1)) throw OptionError("p", "dropout probability must be in [0, 1), got " + number_str(p));
}

at::Tensor Dropout::forward(const at::Tensor& x) { return p == 0 ? x : at::dropout(x, p, is_training()); }
std::string Dropout::describe() const { return "p=" + number_str(p); }

bool Native::wants(const char* name) const {
  return hook && std::find(wanted.begin(), wanted.end(), name) != wanted.end();
}

SwiGLU::SwiGLU(const SwiGLUOptions& o) : dim(o.dim()), hidden(o.hidden()), activation(o.activation()) {
  require_positive(dim, "dim");
  require_positive(hidden, "hidden");
  if (activation != "silu" && activation != "gelu_tanh" && activation != "gelu")
    throw OptionError("activation", "unknown activation '" + activation + "', expected silu, gelu_tanh or gelu");
  gate = register_module("gate", std::make_shared<Linear>(LinearOptions(dim, hidden).bias(o.bias())));
  up = register_module("up", std::make_shared<Linear>(LinearOptions(dim, hidden).bias(o.bias())));
  down = register_module("down", std::make_shared<Linear>(LinearOptions(hidden, dim).bias(o.bias())));
}

namespace {
at::Tensor gate_activation(const std::string& name, const at::Tensor& x) {
  return name == "silu" ? at::silu(x) : at::gelu(x, name == "gelu_tanh" ? "tanh" : "none");
}
}  // namespace

at::Tensor SwiGLU::forward(const at::Tensor& x) {
  require_last_dim(x, dim, "SwiGLU");
  if (!hook) return down->forward(gate_activation(activation, gate->forward(x)) * up->forward(x));
  at::Tensor pre = at_hook("pre", gate->forward(x)), pre_linear = at_hook("pre_linear", up->forward(x));
  return down->forward(at_hook("post", gate_activation(activation, pre) * pre_linear));
}

std::string SwiGLU::describe() const {
  return std::to_string(dim) + " -> " + std::to_string(hidden) + " -> " + std::to_string(dim) +
         (activation != "silu" ? ", activation='" + activation + "'" : "");
}

VibeAttention::VibeAttention(bool c) : causal(c) {}

// ---- MLP -------------------------------------------------------------------------------

MLP::MLP(const MLPOptions& o) : dim(o.dim()), hidden(o.hidden()), activation(o.activation()) {
  require_positive(dim, "dim");
  require_positive(hidden, "hidden");
  Activation check(activation);  // validates the name
  fc = register_module("fc", std::make_shared<Linear>(LinearOptions(dim, hidden).bias(o.bias())));
  proj = register_module("proj", std::make_shared<Linear>(LinearOptions(hidden, dim).bias(o.bias())));
}

at::Tensor MLP::forward(const at::Tensor& x) {
  require_last_dim(x, dim, "MLP");
  at::Tensor h = at_hook("pre", fc->forward(x));
  h = at_hook("post", Activation::apply(activation, h));
  return proj->forward(h);
}

std::string MLP::describe() const {
  return std::to_string(dim) + " -> " + std::to_string(hidden) + " -> " + std::to_string(dim) + ", activation='" +
         activation + "'";
}

}  // namespace anatomy::nn
