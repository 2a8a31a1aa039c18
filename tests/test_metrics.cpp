// The autopsy's measures in C++, without Lua, on inputs whose answers are known.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <cmath>

#include "host/metrics/metrics.h"

using namespace anatomy::metrics;

TEST_CASE("effective rank: exp of the entropy of the normalised singular values") {
  CHECK(effective_rank(at::eye(5, at::kDouble)) == Approx(5).epsilon(1e-12));            // equal singular values
  CHECK(effective_rank(at::ones({6, 4}, at::kDouble)) == Approx(1).epsilon(1e-9));      // rank one
  at::Tensor d = at::diag(at::tensor({3.0, 1.0}, at::kDouble));                          // p = (3/4, 1/4)
  double h = -(0.75 * std::log(0.75) + 0.25 * std::log(0.25));
  CHECK(effective_rank(d) == Approx(std::exp(h)).epsilon(1e-12));
  auto batch = effective_ranks({at::eye(3, at::kDouble), d});
  REQUIRE(batch.size() == 2);
  CHECK(batch[0] == Approx(3).epsilon(1e-9));
  CHECK(batch[1] == Approx(std::exp(h)).epsilon(1e-9));
}

TEST_CASE("attention entropy and diagonal mass of identity and uniform patterns") {
  at::Tensor identity = at::eye(4, at::kDouble).expand({2, 3, 4, 4});
  CHECK(attention_entropy(identity) == Approx(0).margin(1e-12));
  CHECK(diagonal_mass(identity) == Approx(1));
  at::Tensor uniform = at::full({1, 2, 4, 4}, 0.25, at::kDouble);
  CHECK(attention_entropy(uniform) == Approx(std::log(4.0)));
  CHECK(diagonal_mass(uniform) == Approx(0.25));
  at::Tensor per_head = attention_entropy_per_head(uniform);
  CHECK(per_head.numel() == 2);
}

TEST_CASE("activation statistics, influence and residual ratio") {
  at::Tensor x = at::tensor({1.0, -1.0, 3.0, -3.0}, at::kDouble);
  ActivationStats s = activation_stats(x);
  CHECK(s.mean == Approx(0));
  CHECK(s.max_abs == Approx(3));
  CHECK(s.rms == Approx(std::sqrt(5.0)));
  CHECK(s.std == Approx(std::sqrt(5.0)));  // population std
  at::Tensor a = at::randn({2, 3, 8}, at::kDouble);
  CHECK(block_influence(a, a) == Approx(0).margin(1e-12));   // output = input: no influence
  CHECK(block_influence(a, -a) == Approx(2));                // opposite direction
  CHECK(residual_ratio(a, 3 * a) == Approx(2));              // f(x) = out - in = 2x
  auto n = norms({at::tensor({3.0, 4.0}), at::tensor({12.0})});
  CHECK(n == std::vector<double>{5.0, 12.0});
}
