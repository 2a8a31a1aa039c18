// The built-in attentions (see blocks.h): Attention, RoPEAttention and
// VibeAttention, their masks (causal, sliding window, padding) and key/value
// caches, and attend(), the hooked tail (scores, pattern, z, each head's
// result) the first two share.
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

// ---- masks ----------------------------------------------------------------------------

// Which of Tk keys each of the last T of Tk positions attends to (T, Tk): key
// j from query i when j <= Tk - T + i, with a window when Tk - T + i - j <
// window. Under a padding mask pad (B, Tk), (B, 1, T, Tk): never a padded key,
// and always itself (a padded query would see nothing else, and a softmax over
// nothing is NaN; no real position and no metric reads a padded one's output).
// Undefined when every query sees every key (no padding, one new position or
// not causal, no window).
at::Tensor allowed_keys(int64_t T, int64_t Tk, bool causal, int64_t window, const at::Tensor& pad, const at::Device& device) {
  if (!pad.defined() && (!causal || T == 1) && window <= 0) return at::Tensor();
  auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  at::Tensor i = at::arange(Tk - T, Tk, opts).unsqueeze(1), j = at::arange(Tk, opts).unsqueeze(0);
  at::Tensor allowed = pad.defined() ? pad.to(device, at::kBool).view({pad.size(0), 1, 1, Tk}).expand({pad.size(0), 1, T, Tk})
                                     : at::ones({T, Tk}, opts.dtype(at::kBool));
  if (causal) allowed = allowed & j.le(i);
  if (window > 0) allowed = allowed & (i - j).lt(window);
  return pad.defined() ? allowed | j.eq(i) : allowed;
}

// Where T positions do not see each other (T, T), allowed_keys' complement for
// masked_fill_; undefined when they all do. Kept in `cache` and rebuilt only
// when the length or the device changes.
const at::Tensor& blocked_keys(at::Tensor& cache, int64_t T, bool causal, int64_t window, const at::Device& device) {
  if (!cache.defined() || cache.size(0) != T || cache.device() != device) {
    at::Tensor allowed = allowed_keys(T, T, causal, window, at::Tensor(), device);
    cache = allowed.defined() ? allowed.logical_not() : at::Tensor();
  }
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

// The end of an attention's hooked path: z (B, T, H, D) through the output
// projection. With "result" wanted, each head's share of the output,
// result[b, t, h] = z[b, t, h] · W[:, h·D:(h+1)·D]ᵀ (B, T, H, C), passes
// through the hook; replaced, the output is its sum over heads plus the
// bias, else the projection as the unhooked path computes it.
at::Tensor project_heads(Linear& out, const at::Tensor& z, const Native::HookFn& hook, bool want_result) {
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

// ---- what the attentions share ------------------------------------------------------

at::Tensor AttentionBase::split_heads(const char* name, const at::Tensor& t, int64_t H) const {
  return at_hook(name, t.view({t.size(0), t.size(1), H, t.size(2) / H})).transpose(1, 2);
}

const at::Tensor& AttentionBase::padding(int64_t B, int64_t Tk) const {
  check_mask(pad_mask, B, Tk, kind().c_str());
  return pad_mask;
}

// While caching or under a padding mask the keys are more than q's positions,
// or some padded: which each query sees is made for this call. Else the mask
// depends on T alone and is kept; with no window, the fused kernel's causal
// flag stands for it.
at::Tensor AttentionBase::attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Linear& out,
                                 const AttendOptions& how) {
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), Tk = k.size(2);
  const bool general = caching || pad_mask.defined();
  const at::Tensor& pad = pad_mask.defined() ? padding(B, Tk) : pad_mask;
  const at::Tensor allowed = general ? allowed_keys(T, Tk, how.causal(), how.window(), pad, q.device()) : at::Tensor();
  auto square = [&]() -> const at::Tensor& { return blocked_keys(blocked_, T, how.causal(), how.window(), q.device()); };
  const double scale = how.scale() > 0 ? how.scale() : 1.0 / std::sqrt(static_cast<double>(D));
  if (!keep_pattern && !hook && how.softcap() == 0) {  // no probe wants the pattern: one fused kernel where LibTorch has it
    const at::Tensor mask = general ? allowed : how.window() > 0 ? square().logical_not() : at::Tensor();
    at::Tensor y = compat::fused_attention(q, k, v, mask, how.causal() && !general, how.scale());
    if (y.defined()) return out.forward(y.transpose(1, 2).reshape({B, T, H * D}));
  }
  // (B, H, T, Tk), scaled and masked in place: the product is a fresh tensor
  // autograd does not keep (matmul keeps q and k), and at 8x256 tokens each
  // copy would be 25 MiB more of fresh memory per layer
  at::Tensor att = at::matmul(q, k.transpose(-2, -1)).mul_(scale);
  if (how.softcap() > 0) att = at::tanh(att / how.softcap()) * how.softcap();  // (Gemma 2's soft-capping, before the mask)
  const at::Tensor blocked = !general ? square() : allowed.defined() ? allowed.logical_not() : allowed;
  if (blocked.defined()) att.masked_fill_(blocked, -std::numeric_limits<double>::infinity());
  att = at_hook("scores", att);
  const at::ScalarType to = how.float_softmax();
  att = at_hook("pattern", to == at::ScalarType::Undefined ? at::softmax(att, -1) : at::softmax(att, -1, at::kFloat).to(to));
  if (keep_pattern) pattern = pattern_grad ? att : att.detach();
  at::Tensor z = at::matmul(att, v).transpose(1, 2);  // (B, T, H, D)
  if (!hook) return out.forward(z.reshape({B, T, H * D}));
  return project_heads(out, at_hook("z", z), hook, wants("result"));
}

// ---- attention ----------------------------------------------------------------------

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
  auto parts = qkv->forward(x).split(dim, -1);  // q, k, v: (B, T, C)
  at::Tensor q = split_heads("q", parts[0], heads), k = split_heads("k", parts[1], heads);  // (B, H, T, D)
  at::Tensor v = split_heads("v", parts[2], heads);
  if (caching) append_to_cache(past_k, past_v, k, v);
  return attend(q, k, v, *proj, AttendOptions().causal(causal));
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
  if (sc != "default" && sc != "linear" && sc != "llama3" && sc != "longrope")
    throw OptionError("scaling", "unknown RoPE scaling '" + sc + "', expected default, linear, llama3 or longrope");
  if (!(o.factor() > 0)) throw OptionError("factor", "factor must be positive, got " + std::to_string(o.factor()));
  if (!(o.scale() >= 0) || !std::isfinite(o.scale())) throw OptionError("scale", "scale must be positive, got " + number_str(o.scale()));
  if (!(o.softcap() >= 0) || !std::isfinite(o.softcap())) throw OptionError("softcap", "softcap must be positive, got " + number_str(o.softcap()));
  if (!(o.attention_factor() > 0) || !std::isfinite(o.attention_factor()))
    throw OptionError("attention_factor", "attention_factor must be positive, got " + number_str(o.attention_factor()));
  const std::string& qn = o.qk_norm();
  if (qn != "none" && qn != "head" && qn != "proj")
    throw OptionError("qk_norm", "unknown qk_norm '" + qn + "', expected none, head (over each head) or proj (over the whole projection)");
  if (sc == "longrope") {
    for (const auto& [name, f] : {std::pair<const char*, const std::vector<double>*>{"short_factor", &o.short_factor()}, {"long_factor", &o.long_factor()}}) {
      if (static_cast<int64_t>(f->size()) != rotary_dim / 2)
        throw OptionError(name, std::string(name) + " must hold rotary_dim/2 = " + std::to_string(rotary_dim / 2) + " numbers, got " + std::to_string(f->size()));
      for (double x : *f)
        if (!(x > 0) || !std::isfinite(x)) throw OptionError(name, std::string(name) + " must hold positive numbers, got " + number_str(x));
    }
  } else if (!o.short_factor().empty() || !o.long_factor().empty()) {
    throw OptionError(o.short_factor().empty() ? "long_factor" : "short_factor", "short_factor and long_factor are longrope's; scaling is " + sc);
  }
  const int64_t H = o.heads(), KV = o.kv_heads(), D = head_dim, C = o.dim();
  q = register_module("q", std::make_shared<Linear>(LinearOptions(C, H * D).bias(o.qkv_bias())));
  k = register_module("k", std::make_shared<Linear>(LinearOptions(C, KV * D).bias(o.qkv_bias())));
  v = register_module("v", std::make_shared<Linear>(LinearOptions(C, KV * D).bias(o.qkv_bias())));
  this->o = register_module("o", std::make_shared<Linear>(LinearOptions(H * D, C).bias(o.out_bias())));
  if (qn != "none") {
    auto norm_of = [&](int64_t width) { return std::make_shared<RMSNorm>(NormOptions(width, o.qk_norm_eps()).offset(o.qk_norm_offset())); };
    q_norm = register_module("q_norm", norm_of(qn == "head" ? D : H * D));
    k_norm = register_module("k_norm", norm_of(qn == "head" ? D : KV * D));
  }
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
  if (sc == "longrope") {
    auto factors = [](const std::vector<double>& f) { return at::tensor(at::ArrayRef<double>(f), at::kDouble); };
    inv_freq_long = inv_freq / factors(o.long_factor());
    inv_freq = inv_freq / factors(o.short_factor());
  }
}

// project, split heads, rotate, cache, attend, project (nanoGPT's CausalSelfAttention.forward, with RoPE)
at::Tensor RoPEAttention::forward(const at::Tensor& x) {
  require_btc(x, options.dim(), "RoPEAttention");
  at::Tensor qh = norm("q_normed", q_norm, split_heads("q", q->forward(x), options.heads()));     // (B, H, T, D)
  at::Tensor kh = norm("k_normed", k_norm, split_heads("k", k->forward(x), options.kv_heads()));  // (B, kv_heads, T, D)
  at::Tensor vh = split_heads("v", v->forward(x), options.kv_heads());
  auto [cos, sin] = angles(x);
  qh = rotate("rot_q", qh, cos, sin);
  kh = rotate("rot_k", kh, cos, sin);
  if (caching) append_to_cache(past_k, past_v, kh, vh);
  // softmax in float32, as transformers does
  auto how = AttendOptions().causal(options.causal()).window(options.sliding_window()).float_softmax(x.scalar_type())
      .scale(options.scale()).softcap(options.softcap());
  return attend(qh, shared(kh), shared(vh), *o, how);
}

// cos and sin of x's positions' angles (T, R), under a padding mask (B, 1, T, R),
// in x's dtype: while caching, x's positions follow the cached ones; under a
// padding mask each example's count its real tokens.
std::pair<at::Tensor, at::Tensor> RoPEAttention::angles(const at::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), first = past();
  // each frequency for both dims of its pair: (f0, f1, ..., f0, f1, ...), interleaved (f0, f0, f1, f1, ...)
  auto pairs = [&](const at::Tensor& f) { return options.interleaved() ? f.repeat_interleave(2, -1) : at::cat({f, f}, -1); };
  // longrope: the long factors' frequencies when the last position is past original_max_positions (all positions, as transformers)
  auto freq = [&](int64_t last) {
    return inv_freq_long.defined() && last > options.original_max_positions() ? inv_freq_long : inv_freq;
  };
  at::Tensor emb;
  if (pad_mask.defined()) {
    at::Tensor pos = positions_of(padding(B, first + T), T).to(at::kFloat);  // (B, T), the mask's device
    const int64_t last = inv_freq_long.defined() ? static_cast<int64_t>(pos.max().item<float>()) + 1 : 0;
    at::Tensor freqs = pos.unsqueeze(-1) * freq(last).to(pos.device(), at::kFloat).view({1, 1, -1});  // (B, T, R/2)
    emb = pairs(freqs).unsqueeze(1);                                                                    // (B, 1, T, R)
  } else if (first > 0 || !cos_.defined() || cos_.size(0) != T || cos_.device() != x.device() || cos_.scalar_type() != x.scalar_type()) {
    // angles in float32 as transformers computes them, then cast to x's dtype
    at::Tensor pos = at::arange(first, first + T, at::TensorOptions().dtype(at::kFloat));
    at::Tensor freqs = at::outer(pos, freq(first + T).to(at::kFloat));  // (T, R/2)
    emb = pairs(freqs);                                                  // (T, R)
  } else {
    return {cos_, sin_};
  }
  at::Tensor c = emb.cos(), s = emb.sin();
  if (options.attention_factor() != 1.0) c = c * options.attention_factor(), s = s * options.attention_factor();
  at::Tensor cos = c.to(x.device(), x.scalar_type()), sin = s.to(x.device(), x.scalar_type());
  if (!pad_mask.defined() && first == 0) cos_ = cos, sin_ = sin;
  return {cos, sin};
}

// t (B, heads, T, D) with the first R dims of each head rotated, the pairs
// being (i, i + R/2), interleaved (2i, 2i + 1); through the hook as (B, T, heads, D).
at::Tensor RoPEAttention::rotate(const char* name, const at::Tensor& t, const at::Tensor& cos, const at::Tensor& sin) const {
  const int64_t R = rotary_dim, D = head_dim;
  at::Tensor r = R == D ? t : t.narrow(-1, 0, R);
  at::Tensor turned;  // each pair (a, b) as (-b, a)
  if (options.interleaved()) {
    at::Tensor p = r.unflatten(-1, {R / 2, 2});
    turned = at::stack({-p.select(-1, 1), p.select(-1, 0)}, -1).flatten(-2);
  } else {
    turned = at::cat({-r.narrow(-1, R / 2, R / 2), r.narrow(-1, 0, R / 2)}, -1);
  }
  at::Tensor rotated = r * cos + turned * sin;
  if (R != D) rotated = at::cat({rotated, t.narrow(-1, R, D - R)}, -1);
  return hook ? at_hook(name, rotated.transpose(1, 2)).transpose(1, 2) : rotated;
}

// Queries or keys (B, heads, T, D) through their qk_norm: over D, or over the
// whole projection (heads·D) as it came out of q or k; unchanged without one.
// The result goes through the hook `name` (q_normed, k_normed) as (B, T, heads, D)
// where there is a norm (TransformerLens's hook_q_normed, hook_k_normed).
at::Tensor RoPEAttention::norm(const char* name, const std::shared_ptr<RMSNorm>& n, const at::Tensor& t) const {
  if (!n) return t;
  const int64_t B = t.size(0), H = t.size(1), T = t.size(2), D = t.size(3);
  at::Tensor normed = options.qk_norm() == "head" ? n->forward(t)
      : n->forward(t.transpose(1, 2).reshape({B, T, H * D})).view({B, T, H, D}).transpose(1, 2);
  return hook ? at_hook(name, normed.transpose(1, 2)).transpose(1, 2) : normed;
}

// Keys or values (B, kv_heads, Tk, D) repeated for each query head of their group (B, H, Tk, D).
at::Tensor RoPEAttention::shared(const at::Tensor& kv) const {
  const int64_t H = options.heads(), KV = options.kv_heads();
  return KV == H ? kv : kv.repeat_interleave(H / KV, 1);
}

std::string RoPEAttention::describe() const {
  std::string s = std::to_string(options.dim()) + ", heads=" + std::to_string(options.heads());
  if (options.kv_heads() != options.heads()) s += ", kv_heads=" + std::to_string(options.kv_heads());
  if (head_dim * options.heads() != options.dim()) s += ", head_dim=" + std::to_string(head_dim);
  if (rotary_dim != head_dim) s += ", rotary_dim=" + std::to_string(rotary_dim);
  s += ", theta=" + number_str(options.theta());
  if (options.scaling() == "longrope") s += ", scaling=longrope";
  else if (options.scaling() != "default") s += ", scaling=" + options.scaling() + " x" + number_str(options.factor());
  if (options.sliding_window() > 0) s += ", sliding_window=" + std::to_string(options.sliding_window());
  if (options.interleaved()) s += ", interleaved";
  if (options.scale() > 0) s += ", scale=" + number_str(options.scale());
  if (options.softcap() > 0) s += ", softcap=" + number_str(options.softcap());
  if (options.qk_norm() != "none") s += ", qk_norm=" + options.qk_norm();
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
  const at::Tensor& blocked = blocked_keys(mask_, T, causal, 0, x.device());
  const at::Tensor* mask = blocked.defined() ? &blocked : nullptr;
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
