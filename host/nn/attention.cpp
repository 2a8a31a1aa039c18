// The built-in attentions (see blocks.h): Attention, RoPEAttention and
// VibeAttention, their masks (causal, sliding window, padding) and key/value
// caches, and the hooked tail (scores, pattern, z, each head's result).
#include "host/nn/blocks.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "host/nn/block_helpers.h"
#include "host/runtime.h"
#include "host/torch_compat.h"
#include "host/tensor_format.h"

namespace anatomy::nn {
using namespace detail;
namespace {

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

}  // namespace anatomy::nn
