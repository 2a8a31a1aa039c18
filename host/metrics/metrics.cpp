// The autopsy's measurement kernels (see metrics.h).
#include "host/metrics/metrics.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace anatomy::metrics {
namespace {

// (…, C) -> (tokens, C), in float64
at::Tensor tokens(const at::Tensor& x) {
  if (x.dim() < 1) throw std::invalid_argument("expected a tensor with a channel dimension");
  return x.detach().to(at::kDouble).reshape({-1, x.size(-1)});
}

void check_pattern(const at::Tensor& p) {
  if (p.dim() != 4 || p.size(2) != p.size(3))
    throw std::invalid_argument("expected attention patterns of shape (B, H, T, T)");
}

void check_same_shape(const at::Tensor& a, const at::Tensor& b) {
  if (!a.sizes().equals(b.sizes())) throw std::invalid_argument("input and output must have the same shape");
}

// exp of the entropy of the normalised singular values s (float64); 0 for a
// zero matrix. A 0-dim tensor on s's device: nothing is read back here, so
// that many ranks are read together (on a GPU each read waits for the device).
at::Tensor erank_of_singular_values(const at::Tensor& s) {
  at::Tensor total = s.sum();
  at::Tensor p = s / total.clamp_min(std::numeric_limits<double>::min());
  at::Tensor h = -at::special_xlogy(p, p).sum();  // 0 log 0 = 0
  return at::where(total.gt(0), h.exp(), at::zeros_like(h));
}

}  // namespace

double effective_rank(const at::Tensor& x) {
  if (x.dim() < 2) throw std::invalid_argument("effective rank needs a matrix or an activation of 2+ dimensions");
  at::Tensor m = x.dim() == 2 ? x.detach().to(at::kDouble) : tokens(x);
  return erank_of_singular_values(at::linalg_svdvals(m)).item<double>();
}

namespace {

// The Gram matrix of each, the smaller of W·Wᵀ and Wᵀ·W, in float64 (so that
// squaring loses nothing that matters here), computed where the matrix is:
// σ² are its eigenvalues, one small symmetric eigenproblem instead of an SVD,
// several times faster.
std::vector<at::Tensor> gram_matrices(const std::vector<at::Tensor>& matrices) {
  std::vector<at::Tensor> grams(matrices.size());
  for (size_t i = 0; i < matrices.size(); ++i) {
    const at::Tensor& m = matrices[i];
    if (m.dim() != 2) throw std::invalid_argument("effective_ranks: matrix " + std::to_string(i + 1) + " is not 2-D");
    at::Tensor w = m.detach().to(at::kDouble);
    grams[i] = m.size(0) <= m.size(1) ? at::mm(w, w.t()) : at::mm(w.t(), w);
  }
  return grams;
}

// The effective ranks of CPU Gram matrices (1-D, float64, on the CPU). The
// eigenproblems are solved on the host whatever the weights' device: on a GPU
// every eigensolver call checks its LAPACK status with a read of the device
// (torch's _linalg_check_errors), one wait a matrix, and PyTorch has no eigh
// that skips it; the Gram matrices come to the host in the caller's one copy.
at::Tensor ranks_of_grams(const std::vector<at::Tensor>& grams) {
  const size_t n = grams.size();
  std::vector<at::Tensor> eigenvalues(n);
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  // Eigenproblems of a few hundred rows gain little from LAPACK's threads;
  // instead each thread takes whole problems, largest first, from a shared
  // queue (a LAPACK call inside an ATen parallel region runs single-threaded).
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return grams[a].size(0) > grams[b].size(0); });
  std::atomic<size_t> next{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    for (size_t k; (k = next++) < n;) eigenvalues[order[k]] = at::linalg_eigvalsh(grams[order[k]]);
  });
  std::vector<at::Tensor> ranks(n);
  for (size_t i = 0; i < n; ++i) ranks[i] = erank_of_singular_values(eigenvalues[i].clamp_min(0).sqrt());
  return n ? at::stack(ranks) : at::empty({0}, at::kDouble);
}

// values (1-D float64) and the Gram matrices, each where it was computed,
// brought to the host in one copy: values first, then each Gram matrix.
std::pair<at::Tensor, std::vector<at::Tensor>> to_host(const at::Tensor& values, const std::vector<at::Tensor>& grams) {
  std::vector<at::Tensor> parts{values.to(at::kDouble).reshape({-1})};
  bool on_cpu = values.is_cpu();
  for (const auto& g : grams) {
    parts.push_back(g.reshape({-1}).to(values.device()));
    on_cpu = on_cpu && g.is_cpu();
  }
  if (on_cpu) return {parts[0].contiguous(), grams};
  at::Tensor host = at::cat(parts).to(at::kCPU);
  std::vector<at::Tensor> host_grams;
  int64_t at = values.numel();
  for (const auto& g : grams) {
    host_grams.push_back(host.narrow(0, at, g.numel()).view(g.sizes()));
    at += g.numel();
  }
  return {host.narrow(0, 0, values.numel()), host_grams};
}

// a 1-D float64 tensor's values on the host (one copy)
std::vector<double> read(const at::Tensor& t) {
  at::Tensor c = t.to(at::kCPU, at::kDouble).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

// norms, left on their device: NaN for an undefined tensor
at::Tensor norms_unread(const std::vector<at::Tensor>& tensors, const at::TensorOptions& where) {
  std::vector<at::Tensor> defined;
  for (const auto& t : tensors)
    if (t.defined()) defined.push_back(t.detach());
  std::vector<at::Tensor> found = defined.empty() ? std::vector<at::Tensor>() : at::_foreach_norm(defined);
  std::vector<at::Tensor> out;
  at::Tensor nan = at::full({}, std::nan(""), where);
  for (size_t i = 0, j = 0; i < tensors.size(); ++i) out.push_back(tensors[i].defined() ? found[j++].to(where) : nan);
  return out.empty() ? at::empty({0}, where) : at::stack(out);
}

// mean, population std, max |x|, rms, left on x's device (4, float64)
at::Tensor activation_stats_unread(const at::Tensor& x) {
  at::Tensor d = x.detach().to(at::kDouble);
  if (d.numel() == 0) throw std::invalid_argument("activation statistics of an empty tensor");
  return at::stack({d.mean(), d.std(/*unbiased=*/false), d.abs().max(), d.pow(2).mean().sqrt()});
}

at::Tensor diagonal_mass_unread(const at::Tensor& pattern) {
  check_pattern(pattern);
  return pattern.detach().diagonal(0, -2, -1).to(at::kDouble).mean();
}

}  // namespace

std::vector<double> effective_ranks(const std::vector<at::Tensor>& matrices) {
  if (matrices.empty()) return {};
  std::vector<at::Tensor> grams = gram_matrices(matrices);
  auto host = to_host(at::empty({0}, grams[0].options()), grams);  // every Gram matrix in one copy
  return read(ranks_of_grams(host.second));
}

std::vector<double> norms(const std::vector<at::Tensor>& tensors) {
  at::TensorOptions where = at::TensorOptions().dtype(at::kDouble);
  for (const auto& t : tensors)
    if (t.defined()) { where = where.device(t.device()); break; }
  return read(norms_unread(tensors, where));  // read on the host, once
}

at::Tensor attention_entropy_per_head(const at::Tensor& pattern) {
  check_pattern(pattern);
  // p log p in the pattern's own precision (float32: the logarithm is
  // vectorised, ~10x faster than in float64, and each term is good to 1e-7
  // relative), summed in float64. 0 log 0 = 0: masked entries contribute nothing.
  at::Tensor a = pattern.detach();
  if (!at::isFloatingType(a.scalar_type()) || a.element_size() < 4) a = a.to(at::kFloat);
  at::Tensor plogp = at::where(a.gt(0), a * a.log(), at::zeros_like(a));
  at::Tensor h = -plogp.sum(-1, /*keepdim=*/false, at::kDouble);  // (B, H, T)
  return h.mean(at::IntArrayRef{0, 2});  // (H)
}

double attention_entropy(const at::Tensor& pattern) { return attention_entropy_per_head(pattern).mean().item<double>(); }

double diagonal_mass(const at::Tensor& pattern) { return diagonal_mass_unread(pattern).item<double>(); }

ActivationStats activation_stats(const at::Tensor& x) {
  std::vector<double> v = read(activation_stats_unread(x));  // the four computed where x is, read together
  return ActivationStats{v[0], v[1], v[2], v[3]};
}

UnreadStepValues step_values_unread(const std::vector<at::Tensor>& weights, const std::vector<at::Tensor>& grads,
                                    const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& patterns) {
  // every number on one device (the first tensor's), then one copy
  at::TensorOptions where = at::TensorOptions().dtype(at::kDouble);
  for (const auto* list : {&weights, &grads, &outputs, &patterns}) {
    bool found = false;
    for (const auto& t : *list)
      if (t.defined()) { where = where.device(t.device()); found = true; break; }
    if (found) break;
  }
  at::Tensor nan = at::full({1}, std::nan(""), where);
  std::vector<at::Tensor> parts;
  parts.push_back(norms_unread(grads, where));
  for (const auto& o : outputs) parts.push_back(o.defined() ? activation_stats_unread(o).to(where) : nan.expand({4}));
  for (const auto& p : patterns) {
    parts.push_back(p.defined() ? attention_entropy_per_head(p).mean().reshape({1}).to(where) : nan);
    parts.push_back(p.defined() ? diagonal_mass_unread(p).reshape({1}).to(where) : nan);
  }
  UnreadStepValues u{at::cat(parts), gram_matrices(weights), grads.size(), outputs.size(), patterns.size()};
  return u;
}

StepValues read_step_values(const UnreadStepValues& u) {
  auto host = to_host(u.values, u.grams);  // the one copy
  std::vector<double> v = read(host.first);
  StepValues s;
  s.eranks = read(ranks_of_grams(host.second));
  size_t k = 0;
  for (size_t i = 0; i < u.grads; ++i) s.norms.push_back(v[k++]);
  for (size_t i = 0; i < u.outputs; ++i, k += 4) s.stats.push_back(ActivationStats{v[k], v[k + 1], v[k + 2], v[k + 3]});
  for (size_t i = 0; i < u.patterns; ++i) {
    s.entropy.push_back(v[k++]);
    s.diag.push_back(v[k++]);
  }
  return s;
}

StepValues step_values(const std::vector<at::Tensor>& weights, const std::vector<at::Tensor>& grads,
                       const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& patterns) {
  return read_step_values(step_values_unread(weights, grads, outputs, patterns));
}

double block_influence(const at::Tensor& input, const at::Tensor& output) {
  check_same_shape(input, output);
  at::Tensor a = tokens(input), b = tokens(output);
  at::Tensor cos = (a * b).sum(-1) / (a.norm(2, -1) * b.norm(2, -1)).clamp_min(1e-30);
  return 1.0 - cos.mean().item<double>();
}

double residual_ratio(const at::Tensor& input, const at::Tensor& output) {
  check_same_shape(input, output);
  at::Tensor x = tokens(input), f = tokens(output) - x;
  return (f.norm(2, -1) / x.norm(2, -1).clamp_min(1e-30)).mean().item<double>();
}

}  // namespace anatomy::metrics
