// Built-in blocks (see blocks.h). Each forward checks its input and says what
// it expected; the arithmetic is ATen's.
#include "host/nn/blocks.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "host/runtime.h"
#include "host/torch_compat.h"
#include "host/tensor_format.h"

namespace anatomy::nn {
namespace {

std::string bool_str(bool b) { return b ? "true" : "false"; }

std::string number_str(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

void require_positive(int64_t v, const char* field) {
  if (v < 1) throw OptionError(field, std::string(field) + " must be positive, got " + std::to_string(v));
}

void require_positive(double v, const char* field) {
  if (!(v > 0)) throw OptionError(field, std::string(field) + " must be positive, got " + number_str(v));
}

// Parameters are made on the default device, like every factory.
at::TensorOptions param_options() { return at::TensorOptions().dtype(at::kFloat).device(default_device()); }

// A parameter's initial values, unless a checkpoint is about to fill it (SkipInit).
at::Tensor init_uniform(at::Tensor t, double bound) { return SkipInit::active() ? t : t.uniform_(-bound, bound); }
at::Tensor init_normal(at::Tensor t) { return SkipInit::active() ? t : t.normal_(); }

void require_last_dim(const at::Tensor& x, int64_t dim, const char* what) {
  if (x.dim() == 0 || x.size(-1) != dim)
    throw InputError(std::string(what) + " expects inputs whose last dimension is " + std::to_string(dim) +
                     ", got shape " + shape_string(x.sizes()));
  if (!at::isFloatingType(x.scalar_type()))
    throw InputError(std::string(what) + " expects a floating-point input, got " + dtype_name(x.scalar_type()));
}

void require_btc(const at::Tensor& x, int64_t dim, const char* what) {
  if (x.dim() != 3 || (dim > 0 && x.size(2) != dim))
    throw InputError(std::string(what) + " expects input of shape (B, T, " + (dim > 0 ? std::to_string(dim) : "C") +
                     "), got " + shape_string(x.sizes()));
  if (!at::isFloatingType(x.scalar_type()))
    throw InputError(std::string(what) + " expects a floating-point input, got " + dtype_name(x.scalar_type()));
}

// true above the diagonal (filled with -inf): position t sees positions 1..t.
// Kept in `cache` and rebuilt only when the length or the device changes.
const at::Tensor& cached_causal_mask(at::Tensor& cache, int64_t T, const at::Device& device) {
  if (!cache.defined() || cache.size(0) != T || cache.device() != device)
    cache = at::ones({T, T}, at::TensorOptions().dtype(at::kBool).device(device)).triu(1);
  return cache;
}

// Incremental decoding: k and v (B, heads, T, D) become the cache's keys and
// values followed by theirs, which the cache then holds.
void append_to_cache(at::Tensor& past_k, at::Tensor& past_v, at::Tensor& k, at::Tensor& v) {
  if (past_k.defined()) {
    if (past_k.size(0) != k.size(0))
      throw InputError("the key/value cache holds a batch of " + std::to_string(past_k.size(0)) + ", this input has " +
                       std::to_string(k.size(0)) + " (start a new cache)");
    k = at::cat({past_k, k}, 2);
    v = at::cat({past_v, v}, 2);
  }
  past_k = k, past_v = v;
}

// Which of Tk keys each of the last T of Tk positions attends to: key j from
// query i when j <= Tk - T + i (and, with a window, Tk - T + i - j < window).
// Undefined when every query sees every key (one new position, no window).
at::Tensor cached_allowed(int64_t T, int64_t Tk, bool causal, int64_t window, const at::Device& device) {
  if ((!causal || T == 1) && window <= 0) return at::Tensor();
  at::Tensor i = at::arange(Tk - T, Tk, at::TensorOptions().dtype(at::kLong).device(device)).unsqueeze(1);
  at::Tensor j = at::arange(Tk, at::TensorOptions().dtype(at::kLong).device(device)).unsqueeze(0);
  at::Tensor allowed = at::ones({T, Tk}, at::TensorOptions().dtype(at::kBool).device(device));
  if (causal) allowed = allowed & j.le(i);
  if (window > 0) allowed = allowed & (i - j).lt(window);
  return allowed;
}

// The padding mask a block was given, against the positions it covers
// (B, Tk): x's, and while caching the cached ones before them.
void check_mask(const at::Tensor& mask, int64_t B, int64_t Tk, const char* what) {
  if (mask.dim() != 2 || mask.size(0) != B || mask.size(1) != Tk)
    throw InputError(std::string(what) + ": the attention mask is " + shape_string(mask.sizes()) + ", the input needs (" +
                     std::to_string(B) + ", " + std::to_string(Tk) + ")");
}

// Position ids (B, T) of the last T of the mask's positions: how many real
// tokens come before each (padding counts none, so left padding moves none).
at::Tensor positions_of(const at::Tensor& mask, int64_t T) {
  at::Tensor p = (mask.to(at::kLong).cumsum(1) - 1).clamp_min(0);
  return p.narrow(1, p.size(1) - T, T);
}

// Which keys (B, 1, T, Tk) each of the last T of Tk positions attends to
// under a padding mask: causally (and within the window) as without one,
// never to a padded key, and always to itself: a padded query would see
// nothing else, and a softmax over nothing is NaN (a padded position's
// output is read by no real one, and no metric reads it).
at::Tensor padded_allowed(const at::Tensor& mask, int64_t T, bool causal, int64_t window) {
  const int64_t B = mask.size(0), Tk = mask.size(1);
  auto opts = at::TensorOptions().dtype(at::kLong).device(mask.device());
  at::Tensor i = at::arange(Tk - T, Tk, opts).unsqueeze(1), j = at::arange(Tk, opts).unsqueeze(0);
  at::Tensor allowed = mask.to(at::kBool).view({B, 1, 1, Tk}).expand({B, 1, T, Tk});
  if (causal) allowed = allowed & j.le(i);
  if (window > 0) allowed = allowed & (i - j).lt(window);
  return allowed | j.eq(i);
}

}  // namespace


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

RMSNorm::RMSNorm(const NormOptions& o) : dim(o.dim()), eps(o.eps()) {
  require_positive(dim, "dim");
  require_positive(eps, "eps");
  weight = register_parameter("weight", at::ones({dim}, param_options()));
}

at::Tensor RMSNorm::forward(const at::Tensor& x) {
  require_last_dim(x, dim, "RMSNorm");
  if (!hook) return x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps) * weight;
  at::Tensor scale = at_hook("scale", (x.pow(2).mean(-1, /*keepdim=*/true) + eps).sqrt());  // (B, T, 1)
  return at_hook("normalized", x / scale) * weight;
}

std::string RMSNorm::describe() const { return std::to_string(dim) + ", eps=" + number_str(eps); }

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

// ---- attention ----------------------------------------------------------------------

namespace {
// The end of an attention's hooked path: z (B, T, H, D) through the output
// projection. With "result" wanted, each head's share of the output,
// result[b, t, h] = z[b, t, h] · W[:, h·D:(h+1)·D]ᵀ (B, T, H, C), passes
// through the hook; replaced, the output is its sum over heads plus the
// bias, else the projection as the unhooked path computes it.
at::Tensor project_heads(Linear& out, const at::Tensor& z, const std::function<at::Tensor(const char*, const at::Tensor&)>& hook,
                         bool want_result) {
  const int64_t B = z.size(0), T = z.size(1), H = z.size(2), D = z.size(3);
  if (want_result) {
    at::Tensor result = at::einsum("bthd,chd->bthc", {z, out.weight.view({out.out_features, H, D})});
    at::Tensor r = hook("result", result);
    if (!r.is_same(result)) {
      at::Tensor y = r.sum(2);
      return out.bias.defined() ? y + out.bias : y;
    }
  }
  return out.forward(z.reshape({B, T, H * D}));
}
}  // namespace

Attention::Attention(const AttentionOptions& o) : dim(o.dim()), heads(o.heads()), causal(o.causal()) {
  require_positive(dim, "dim");
  require_positive(heads, "heads");
  if (dim % heads != 0)
    throw OptionError("heads", "dim " + std::to_string(dim) + " is not divisible by " + std::to_string(heads) + " heads");
  qkv = register_module("qkv", std::make_shared<Linear>(LinearOptions(dim, 3 * dim).bias(o.bias())));
  proj = register_module("proj", std::make_shared<Linear>(LinearOptions(dim, dim).bias(o.bias())));
}

at::Tensor Attention::forward(const at::Tensor& x) {
  require_btc(x, dim, "Attention");
  const int64_t B = x.size(0), T = x.size(1), C = dim, H = heads, D = C / H;
  auto parts = qkv->forward(x).split(C, -1);  // q, k, v: (B, T, C)
  if (caching || pad_mask.defined()) return forward_general(parts[0], parts[1], parts[2]);
  if (!keep_pattern && !hook) {  // no probe wants the pattern: one fused kernel where LibTorch has it
    auto split_heads = [&](const at::Tensor& t) { return t.view({B, T, H, D}).transpose(1, 2); };  // (B, H, T, D)
    at::Tensor y = compat::fused_attention(split_heads(parts[0]), split_heads(parts[1]), split_heads(parts[2]), at::Tensor(), causal);
    if (y.defined()) return proj->forward(y.transpose(1, 2).reshape({B, T, C}));
  }
  // (B, T, H, D) through the hook, then (B, H, T, D)
  auto heads_of = [&](const char* name, const at::Tensor& t) { return at_hook(name, t.view({B, T, H, D})).transpose(1, 2); };
  at::Tensor q = heads_of("q", parts[0]), k = heads_of("k", parts[1]), v = heads_of("v", parts[2]);
  // (B, H, T, T), scaled and masked in place: the product is a fresh tensor
  // autograd does not keep (matmul keeps q and k), and at 8x256 tokens each
  // copy would be 25 MiB more of fresh memory per layer
  at::Tensor att = at::matmul(q, k.transpose(-2, -1)).mul_(1.0 / std::sqrt(static_cast<double>(D)));
  if (causal) att.masked_fill_(cached_causal_mask(mask_, T, x.device()), -std::numeric_limits<double>::infinity());
  att = at_hook("scores", att);
  att = at_hook("pattern", at::softmax(att, -1));
  if (keep_pattern) pattern = pattern_grad ? att : att.detach();
  at::Tensor z = at::matmul(att, v).transpose(1, 2);  // (B, T, H, D)
  if (!hook) return proj->forward(z.reshape({B, T, C}));
  return project_heads(*proj, at_hook("z", z), hook, wants("result"));
}

// forward while caching or under a padding mask: x's positions follow the
// cached ones; q, k, v (B, T, C) through their hooks for these positions
// only; scores and pattern (B, H, T, past + T); no padded key attended to.
at::Tensor Attention::forward_general(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in) {
  const int64_t B = q_in.size(0), T = q_in.size(1), C = dim, H = heads, D = C / H;
  auto heads_of = [&](const char* name, const at::Tensor& t) { return at_hook(name, t.view({B, T, H, D})).transpose(1, 2); };
  at::Tensor q = heads_of("q", q_in), k = heads_of("k", k_in), v = heads_of("v", v_in);
  if (caching) append_to_cache(past_k, past_v, k, v);
  at::Tensor allowed;
  if (pad_mask.defined()) {
    check_mask(pad_mask, B, k.size(2), "Attention");
    allowed = padded_allowed(pad_mask.to(q.device()), T, causal, 0);
  } else {
    allowed = cached_allowed(T, k.size(2), causal, 0, q.device());
  }
  if (!keep_pattern && !hook) {
    at::Tensor y = compat::fused_attention(q, k, v, allowed, false);
    if (y.defined()) return proj->forward(y.transpose(1, 2).reshape({B, T, C}));
  }
  at::Tensor att = at::matmul(q, k.transpose(-2, -1)).mul_(1.0 / std::sqrt(static_cast<double>(D)));
  if (allowed.defined()) att.masked_fill_(allowed.logical_not(), -std::numeric_limits<double>::infinity());
  att = at_hook("scores", att);
  att = at_hook("pattern", at::softmax(att, -1));
  if (keep_pattern) pattern = pattern_grad ? att : att.detach();
  at::Tensor z = at::matmul(att, v).transpose(1, 2);  // (B, T, H, D)
  if (!hook) return proj->forward(z.reshape({B, T, C}));
  return project_heads(*proj, at_hook("z", z), hook, wants("result"));
}

std::string Attention::describe() const {
  return std::to_string(dim) + ", heads=" + std::to_string(heads) + ", causal=" + bool_str(causal);
}

RoPEAttention::RoPEAttention(const RoPEAttentionOptions& o) : options(o) {
  require_positive(o.dim(), "dim");
  require_positive(o.heads(), "heads");
  require_positive(o.kv_heads(), "kv_heads");
  if (o.heads() % o.kv_heads() != 0)
    throw OptionError("kv_heads", std::to_string(o.heads()) + " heads are not divisible into " + std::to_string(o.kv_heads()) + " key/value heads");
  if (o.head_dim() < 0) throw OptionError("head_dim", "head_dim must be positive, got " + std::to_string(o.head_dim()));
  if (o.head_dim() == 0 && o.dim() % o.heads() != 0)
    throw OptionError("heads", "dim " + std::to_string(o.dim()) + " is not divisible by " + std::to_string(o.heads()) + " heads");
  head_dim = o.head_dim() > 0 ? o.head_dim() : o.dim() / o.heads();
  rotary_dim = o.rotary_dim() > 0 ? o.rotary_dim() : head_dim;
  if (rotary_dim > head_dim || rotary_dim % 2 != 0)
    throw OptionError("rotary_dim", "rotary_dim must be even and at most head_dim " + std::to_string(head_dim) + ", got " + std::to_string(rotary_dim));
  if (!(o.theta() > 0)) throw OptionError("theta", "theta must be positive, got " + std::to_string(o.theta()));
  if (o.sliding_window() < 0) throw OptionError("sliding_window", "sliding_window must be >= 0, got " + std::to_string(o.sliding_window()));
  const std::string& sc = o.scaling();
  if (sc != "default" && sc != "linear" && sc != "llama3")
    throw OptionError("scaling", "unknown RoPE scaling '" + sc + "', expected default, linear or llama3");
  if (!(o.factor() > 0)) throw OptionError("factor", "factor must be positive, got " + std::to_string(o.factor()));
  const int64_t H = o.heads(), KV = o.kv_heads(), D = head_dim, C = o.dim();
  q = register_module("q", std::make_shared<Linear>(LinearOptions(C, H * D).bias(o.qkv_bias())));
  k = register_module("k", std::make_shared<Linear>(LinearOptions(C, KV * D).bias(o.qkv_bias())));
  v = register_module("v", std::make_shared<Linear>(LinearOptions(C, KV * D).bias(o.qkv_bias())));
  this->o = register_module("o", std::make_shared<Linear>(LinearOptions(H * D, C).bias(o.out_bias())));
  // inv_freq[i] = theta^(-2i / rotary_dim), then the scaling's adjustment (as transformers computes it).
  inv_freq = at::arange(0, rotary_dim, 2, at::kDouble).div(static_cast<double>(rotary_dim)).mul(std::log(o.theta())).neg().exp();
  if (sc == "linear") inv_freq = inv_freq / o.factor();
  if (sc == "llama3") {
    const double old_len = static_cast<double>(o.original_max_positions());
    const double low_wavelen = old_len / o.low_freq_factor(), high_wavelen = old_len / o.high_freq_factor();
    at::Tensor wavelen = 2 * M_PI / inv_freq;
    at::Tensor scaled = at::where(wavelen > low_wavelen, inv_freq / o.factor(), inv_freq);
    at::Tensor smooth = (old_len / wavelen - o.low_freq_factor()) / (o.high_freq_factor() - o.low_freq_factor());
    at::Tensor smoothed = (1 - smooth) * scaled / o.factor() + smooth * scaled;
    at::Tensor medium = wavelen.ge(high_wavelen) & wavelen.le(low_wavelen);
    inv_freq = at::where(medium, smoothed, scaled);
  }
}

at::Tensor RoPEAttention::forward(const at::Tensor& x) {
  require_btc(x, options.dim(), "RoPEAttention");
  const int64_t B = x.size(0), T = x.size(1), H = options.heads(), KV = options.kv_heads(), D = head_dim, R = rotary_dim;
  // (B, T, heads, D) through the hook, then (B, heads, T, D)
  at::Tensor qh = at_hook("q", q->forward(x).view({B, T, H, D})).transpose(1, 2);
  at::Tensor kh = at_hook("k", k->forward(x).view({B, T, KV, D})).transpose(1, 2);
  at::Tensor vh = at_hook("v", v->forward(x).view({B, T, KV, D})).transpose(1, 2);
  // while caching, these positions follow the cached ones; under a padding mask each example's count its real tokens
  const int64_t first = caching && past_k.defined() ? past_k.size(2) : 0;
  at::Tensor cos = cos_, sin = sin_;
  if (pad_mask.defined()) {
    check_mask(pad_mask, B, first + T, "RoPEAttention");
    at::Tensor pos = positions_of(pad_mask, T).to(at::kFloat);                                   // (B, T), the mask's device
    at::Tensor freqs = pos.unsqueeze(-1) * inv_freq.to(pos.device(), at::kFloat).view({1, 1, -1});  // (B, T, R/2)
    at::Tensor emb = at::cat({freqs, freqs}, -1).unsqueeze(1);                       // (B, 1, T, R)
    cos = emb.cos().to(x.device(), x.scalar_type());
    sin = emb.sin().to(x.device(), x.scalar_type());
  } else if (first > 0 || !cos_.defined() || cos_.size(0) != T || cos_.device() != x.device() || cos_.scalar_type() != x.scalar_type()) {
    // angles in float32 as transformers computes them, then cast to x's dtype
    at::Tensor pos = at::arange(first, first + T, at::TensorOptions().dtype(at::kFloat));
    at::Tensor freqs = at::outer(pos, inv_freq.to(at::kFloat));  // (T, R/2)
    at::Tensor emb = at::cat({freqs, freqs}, -1);                 // (T, R)
    cos = emb.cos().to(x.device(), x.scalar_type());
    sin = emb.sin().to(x.device(), x.scalar_type());
    if (first == 0) cos_ = cos, sin_ = sin;
  }
  auto rotate = [&](const at::Tensor& t) {
    at::Tensor r = R == D ? t : t.narrow(-1, 0, R);
    at::Tensor half1 = r.narrow(-1, 0, R / 2), half2 = r.narrow(-1, R / 2, R / 2);
    at::Tensor rotated = r * cos + at::cat({-half2, half1}, -1) * sin;
    return R == D ? rotated : at::cat({rotated, t.narrow(-1, R, D - R)}, -1);
  };
  qh = rotate(qh);
  kh = rotate(kh);
  if (hook) {
    qh = at_hook("rot_q", qh.transpose(1, 2)).transpose(1, 2);
    kh = at_hook("rot_k", kh.transpose(1, 2)).transpose(1, 2);
  }
  // while caching or under a padding mask: which of the keys each query sees
  const bool general = caching || pad_mask.defined();
  at::Tensor allowed_cached;
  if (caching) append_to_cache(past_k, past_v, kh, vh);
  if (pad_mask.defined()) {
    allowed_cached = padded_allowed(pad_mask.to(x.device()), T, options.causal(), options.sliding_window());
  } else if (caching) {
    allowed_cached = cached_allowed(T, kh.size(2), options.causal(), options.sliding_window(), x.device());
  }
  if (KV != H) {
    kh = kh.repeat_interleave(H / KV, 1);
    vh = vh.repeat_interleave(H / KV, 1);
  }
  auto make_mask = [&] {
    if (!mask_.defined() || mask_.size(0) != T || mask_.device() != x.device()) {
      at::Tensor i = at::arange(T, at::TensorOptions().dtype(at::kLong).device(x.device())).unsqueeze(1);
      at::Tensor j = i.transpose(0, 1);
      at::Tensor masked = at::zeros({T, T}, at::TensorOptions().dtype(at::kBool).device(x.device()));
      if (options.causal()) masked = masked | j.gt(i);
      if (options.sliding_window() > 0) masked = masked | (i - j).ge(options.sliding_window());
      mask_ = masked;
    }
  };
  if (!keep_pattern && !hook) {  // no probe wants the pattern: one fused kernel where LibTorch has it
    at::Tensor allowed = allowed_cached;
    if (!general && options.sliding_window() > 0) {
      make_mask();
      allowed = mask_.logical_not();
    }
    at::Tensor y = compat::fused_attention(qh, kh, vh, allowed, options.causal() && !general);
    if (y.defined()) return o->forward(y.transpose(1, 2).reshape({B, T, H * D}));
  }
  // (B, H, T, T) (while caching (B, H, T, past + T)), scaled and masked in place (as in Attention::forward)
  at::Tensor att = at::matmul(qh, kh.transpose(-2, -1)).mul_(1.0 / std::sqrt(static_cast<double>(D)));
  if (general) {
    if (allowed_cached.defined()) att.masked_fill_(allowed_cached.logical_not(), -std::numeric_limits<double>::infinity());
  } else if (options.causal() || options.sliding_window() > 0) {
    make_mask();
    att.masked_fill_(mask_, -std::numeric_limits<double>::infinity());
  }
  att = at_hook("scores", att);
  att = at_hook("pattern", at::softmax(att, -1, at::kFloat).to(x.scalar_type()));  // softmax in float32, as transformers does
  if (keep_pattern) pattern = pattern_grad ? att : att.detach();
  at::Tensor z = at::matmul(att, vh).transpose(1, 2);  // (B, T, H, D)
  if (!hook) return o->forward(z.reshape({B, T, H * D}));
  return project_heads(*o, at_hook("z", z), hook, wants("result"));
}

std::string RoPEAttention::describe() const {
  std::string s = std::to_string(options.dim()) + ", heads=" + std::to_string(options.heads());
  if (options.kv_heads() != options.heads()) s += ", kv_heads=" + std::to_string(options.kv_heads());
  if (head_dim * options.heads() != options.dim()) s += ", head_dim=" + std::to_string(head_dim);
  if (rotary_dim != head_dim) s += ", rotary_dim=" + std::to_string(rotary_dim);
  s += ", theta=" + number_str(options.theta());
  if (options.scaling() != "default") s += ", scaling=" + options.scaling() + " x" + number_str(options.factor());
  if (options.sliding_window() > 0) s += ", sliding_window=" + std::to_string(options.sliding_window());
  return s;
}

SwiGLU::SwiGLU(const SwiGLUOptions& o) : dim(o.dim()), hidden(o.hidden()) {
  require_positive(dim, "dim");
  require_positive(hidden, "hidden");
  gate = register_module("gate", std::make_shared<Linear>(LinearOptions(dim, hidden).bias(o.bias())));
  up = register_module("up", std::make_shared<Linear>(LinearOptions(dim, hidden).bias(o.bias())));
  down = register_module("down", std::make_shared<Linear>(LinearOptions(hidden, dim).bias(o.bias())));
}

at::Tensor SwiGLU::forward(const at::Tensor& x) {
  require_last_dim(x, dim, "SwiGLU");
  if (!hook) return down->forward(at::silu(gate->forward(x)) * up->forward(x));
  at::Tensor pre = at_hook("pre", gate->forward(x)), pre_linear = at_hook("pre_linear", up->forward(x));
  return down->forward(at_hook("post", at::silu(pre) * pre_linear));
}

std::string SwiGLU::describe() const { return std::to_string(dim) + " -> " + std::to_string(hidden) + " -> " + std::to_string(dim); }

VibeAttention::VibeAttention(bool c) : causal(c) {}

namespace {

// softmax(mask(x xᵀ·s)) x as one autograd node. Autograd of the composed ops
// keeps the scaled and the masked scores and differentiates the two operands
// of x xᵀ separately (two batched matmuls); here the scores are scaled and
// masked in place, only x and the softmax are kept, and since both operands
// are x their gradients fold into one product: s·(G + Gᵀ)·x. The forward's
// arithmetic is the composed ops' (same values); the backward rounds
// differently, within float32 rounding.
struct VibeAttentionFunction : torch::autograd::Function<VibeAttentionFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                                const at::Tensor* mask, double scale) {
    at::Tensor att = at::bmm(x, x.transpose(1, 2)).mul_(scale);  // (B, T, T)
    if (mask) att.masked_fill_(*mask, -std::numeric_limits<double>::infinity());
    att = at::softmax(att, -1);
    at::Tensor y = at::bmm(att, x);
    ctx->save_for_backward({x, att});
    ctx->saved_data["scale"] = scale;
    ctx->mark_non_differentiable({att});
    return {y, att};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& att = saved[1];
    const double scale = ctx->saved_data["scale"].toDouble();
    const at::Tensor& gy = grads[0];
    // y = A x: dA = gy xᵀ, dx = Aᵀ gy
    at::Tensor gx = at::bmm(att.transpose(1, 2), gy);
    at::Tensor ga = at::bmm(gy, x.transpose(1, 2));
    // A = softmax(S); masked entries have A = 0 and so get no gradient
    at::Tensor gs = at::_softmax_backward_data(ga, att, -1, att.scalar_type());
    // S = s·x xᵀ: dx += s·(dS + dSᵀ) x
    gx.baddbmm_(gs + gs.transpose(1, 2), x, /*beta=*/1, /*alpha=*/scale);
    return {gx, at::Tensor(), at::Tensor()};  // none for the mask pointer and the scale
  }
};

}  // namespace

at::Tensor VibeAttention::forward(const at::Tensor& x) {
  require_btc(x, 0, "VibeAttention");
  const int64_t T = x.size(1), C = x.size(2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(C));
  const at::Tensor* mask = causal ? &cached_causal_mask(mask_, T, x.device()) : nullptr;
  // Under autocast the composed ops too: autocast picks each op's dtype (the matmuls in bfloat16, the softmax in
  // float32), which the one node's backward, run without autocast, could not follow.
  if ((keep_pattern && pattern_grad) || hook || compat::autocast_enabled(x.device().type())) {
    // a probe wants gradients through the pattern, or a hook point: the composed ops, which keep it in the graph.
    // One head: scores and pattern (B, 1, T, T), z (B, T, 1, C) (q = k = v = x, and no projection after)
    at::Tensor att = at::matmul(x, x.transpose(1, 2)) * scale;  // (B, T, T)
    if (mask) att = att.masked_fill(*mask, -std::numeric_limits<double>::infinity());
    if (hook) att = at_hook("scores", att.unsqueeze(1)).squeeze(1);
    att = at::softmax(att, -1);
    if (hook) att = at_hook("pattern", att.unsqueeze(1)).squeeze(1);
    if (keep_pattern) pattern = pattern_grad ? att.unsqueeze(1) : att.detach().unsqueeze(1);  // (B, 1, T, T)
    at::Tensor y = at::matmul(att, x);
    return hook ? at_hook("z", y.unsqueeze(2)).squeeze(2) : y;
  }
  auto out = VibeAttentionFunction::apply(x, mask, scale);
  if (keep_pattern) pattern = out[1].unsqueeze(1);  // (B, 1, T, T), no graph
  return out[0];
}

std::string VibeAttention::describe() const { return "causal=" + bool_str(causal); }

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
