// Exact rationals and certified bounds in C++, without Lua.
#include <catch2/catch.hpp>

#include <cmath>

#include "host/exact/rational.h"

using namespace anatomy::exact;

TEST_CASE("rationals parse, print and take exact square roots") {
  std::string why;
  auto q = parse_rational(" -6/4 ", &why);
  REQUIRE(q);
  CHECK(to_string(*q) == "-3/2");
  CHECK_FALSE(parse_rational("1/0", &why));
  CHECK_FALSE(parse_rational("0.5", &why));
  CHECK(to_string(*exact_sqrt(Rational(9, 4))) == "3/2");
  CHECK_FALSE(exact_sqrt(Rational(2)));
  CHECK(suggest_fraction(0.1) == "1/10");
}

TEST_CASE("bounds contain the true value and are narrow") {
  for (int k = -6; k <= 6; ++k) {
    Rational q(k, 3);
    auto [lo, hi] = exp_bounds(q, 80);
    double e = std::exp(k / 3.0);
    CHECK(to_double(lo) <= e * (1 + 1e-15));
    CHECK(to_double(hi) >= e * (1 - 1e-15));
    CHECK(to_double(hi - lo) < e * 1e-20);
  }
  auto [lo, hi] = sqrt_bounds(Rational(2), Rational(2), 64);
  CHECK(lo * lo <= 2);
  CHECK(hi * hi >= 2);
  CHECK(to_double(hi - lo) < 1e-18);
}
