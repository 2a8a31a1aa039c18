// Measurement kernels of the autopsy. Each takes tensors as the probes
// capture them and returns plain numbers (or a small tensor), computed in
// float64 on the tensor's device. Formulas are stated with each function.
#pragma once
#include <ATen/core/Tensor.h>

#include <vector>

namespace anatomy::metrics {

/// Effective rank (Roy & Vetterli 2007) of a matrix, or of an activation
/// flattened to (tokens, channels): exp(−Σ pᵢ log pᵢ), pᵢ = σᵢ / Σσ over the
/// singular values σ. Between 1 and min(rows, cols); 0 for an all-zero matrix.
double effective_rank(const at::Tensor& x);

/// Effective ranks of many matrices at once (the autopsy's per-step path):
/// their singular values come from the eigenvalues of the smaller Gram
/// matrix in float64 (σ² = eigenvalues of W·Wᵀ or Wᵀ·W), formed where the
/// matrices are and solved on the host after one copy of them all. effective_rank above, by SVD, is the
/// reference; tests hold the two together.
std::vector<double> effective_ranks(const std::vector<at::Tensor>& matrices);

/// L2 norms of many tensors in one pass (NaN for an undefined tensor, such as a missing gradient).
std::vector<double> norms(const std::vector<at::Tensor>& tensors);

/// Attention entropy: for patterns (B, H, T, T) whose rows sum to 1, the mean
/// over batch and queries of −Σ_k a log a (nats), per head: a tensor (H).
at::Tensor attention_entropy_per_head(const at::Tensor& pattern);
/// The same averaged over heads.
double attention_entropy(const at::Tensor& pattern);
/// Mean attention a query pays to itself: mean over B, H, T of a[t, t].
double diagonal_mass(const at::Tensor& pattern);

struct ActivationStats {
  double mean, std, max_abs, rms;  ///< over all elements; std is the population std
};
ActivationStats activation_stats(const at::Tensor& x);

/// The autopsy's numbers of one training step, each by the definition above:
/// the effective rank of every weight, the norm of every gradient (NaN where
/// undefined), the activation statistics of every layer's output, and the
/// attention entropy and diagonal mass of every layer's pattern (NaN where a
/// layer has none). Computed where the tensors are and read back in one copy:
/// on a device each read waits for it, and one step has dozens of numbers.
struct StepValues {
  std::vector<double> eranks, norms;
  std::vector<ActivationStats> stats;   ///< NaNs for a missing output
  std::vector<double> entropy, diag;
};
StepValues step_values(const std::vector<at::Tensor>& weights, const std::vector<at::Tensor>& grads,
                       const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& patterns);
/// The same numbers left where they were computed, read by read_step_values
/// in one copy when the caller wants them: the norms, 4 statistics an output,
/// then entropy and diagonal mass a pattern, in one float64 tensor, and the
/// weights' Gram matrices. Their eigenproblems are solved on the host at the
/// read: on a GPU each eigensolver call reads its LAPACK status back (a wait
/// a weight), and the step itself reads nothing.
struct UnreadStepValues {
  at::Tensor values;
  std::vector<at::Tensor> grams;
  size_t grads, outputs, patterns;
};
UnreadStepValues step_values_unread(const std::vector<at::Tensor>& weights, const std::vector<at::Tensor>& grads,
                                    const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& patterns);
StepValues read_step_values(const UnreadStepValues& unread);
/// Block influence (ShortGPT): 1 − mean over tokens of cos(input, output),
/// both flattened to (tokens, channels).
double block_influence(const at::Tensor& input, const at::Tensor& output);

/// Residual contribution: mean over tokens of ‖f(x)‖ / ‖x‖, where f(x) = output − input.
double residual_ratio(const at::Tensor& input, const at::Tensor& output);

}  // namespace anatomy::metrics
