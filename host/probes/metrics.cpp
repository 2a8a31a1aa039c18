// The autopsy's measurement kernels (see metrics.h).
#include "host/probes/metrics.h"

#include <ATen/ATen.h>

#include <cmath>
#include <map>
#include <stdexcept>

namespace anatomy::probes {
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

}  // namespace

double effective_rank(const at::Tensor& x) {
  if (x.dim() < 2) throw std::invalid_argument("effective rank needs a matrix or an activation of 2+ dimensions");
  at::Tensor m = x.dim() == 2 ? x.detach().to(at::kDouble) : tokens(x);
  at::Tensor s = at::linalg_svdvals(m);
  double total = s.sum().item<double>();
  if (total <= 0) return 0.0;
  at::Tensor p = s / total;
  p = p.masked_select(p.gt(0));
  return std::exp(-(p * p.log()).sum().item<double>());
}

std::vector<double> effective_ranks(const std::vector<at::Tensor>& matrices) {
  std::vector<double> out(matrices.size(), 0.0);
  std::map<std::vector<int64_t>, std::vector<size_t>> groups;  // shape -> indices
  for (size_t i = 0; i < matrices.size(); ++i) {
    if (matrices[i].dim() != 2) throw std::invalid_argument("effective_ranks: matrix " + std::to_string(i + 1) + " is not 2-D");
    groups[matrices[i].sizes().vec()].push_back(i);
  }
  for (const auto& [shape, idx] : groups) {
    std::vector<at::Tensor> parts;
    parts.reserve(idx.size());
    for (size_t i : idx) parts.push_back(matrices[i].detach());
    // σ² are the eigenvalues of the smaller Gram matrix (in float64, so that
    // squaring loses nothing that matters here): one small symmetric
    // eigenproblem instead of an SVD, several times faster.
    at::Tensor w = at::stack(parts).to(at::kDouble);  // (n, r, c)
    at::Tensor gram = shape[0] <= shape[1] ? at::matmul(w, w.transpose(1, 2)) : at::matmul(w.transpose(1, 2), w);
    at::Tensor s = at::linalg_eigvalsh(gram).clamp_min(0).sqrt();  // (n, k)
    at::Tensor total = s.sum(-1, /*keepdim=*/true);
    at::Tensor p = s / total.clamp_min(1e-300);
    at::Tensor plogp = at::where(p.gt(0), p * p.log(), at::zeros_like(p)).sum(-1);
    at::Tensor ranks = at::where(total.squeeze(-1).gt(0), at::exp(-plogp), at::zeros_like(plogp)).contiguous();
    const double* r = ranks.data_ptr<double>();
    for (size_t j = 0; j < idx.size(); ++j) out[idx[j]] = r[j];
  }
  return out;
}

std::vector<double> norms(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> defined;
  for (const auto& t : tensors)
    if (t.defined()) defined.push_back(t.detach());
  std::vector<double> out(tensors.size(), std::nan(""));
  if (defined.empty()) return out;
  at::Tensor all = at::stack(at::_foreach_norm(defined)).to(at::kDouble).contiguous();
  const double* v = all.data_ptr<double>();
  for (size_t i = 0, j = 0; i < tensors.size(); ++i)
    if (tensors[i].defined()) out[i] = v[j++];
  return out;
}

at::Tensor attention_entropy_per_head(const at::Tensor& pattern) {
  check_pattern(pattern);
  at::Tensor a = pattern.detach().to(at::kDouble);
  // 0 log 0 = 0: masked entries contribute nothing
  at::Tensor h = -(a * at::where(a.gt(0), a.log(), at::zeros_like(a))).sum(-1);  // (B, H, T)
  return h.mean(at::IntArrayRef{0, 2});                                          // (H)
}

double attention_entropy(const at::Tensor& pattern) { return attention_entropy_per_head(pattern).mean().item<double>(); }

double diagonal_mass(const at::Tensor& pattern) {
  check_pattern(pattern);
  return pattern.detach().to(at::kDouble).diagonal(0, -2, -1).mean().item<double>();
}

ActivationStats activation_stats(const at::Tensor& x) {
  at::Tensor d = x.detach().to(at::kDouble);
  if (d.numel() == 0) throw std::invalid_argument("activation statistics of an empty tensor");
  ActivationStats s;
  s.mean = d.mean().item<double>();
  s.std = d.std(/*unbiased=*/false).item<double>();
  s.max_abs = d.abs().max().item<double>();
  s.rms = d.pow(2).mean().sqrt().item<double>();
  return s;
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

}  // namespace anatomy::probes
