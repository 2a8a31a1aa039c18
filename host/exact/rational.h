// Exact rationals (GMP) and certified bounds for the exact trace
// (lua/anatomy/exact/). No Lua here: bindings/rational.cpp exposes it.
//
// Bounds are intervals with dyadic endpoints (m / 2^bits) that are proven to
// contain the true value: every rounding is outward, every truncated series
// carries its remainder. Comparisons of named values rest on them.
#pragma once
#include <gmpxx.h>

#include <optional>
#include <string>
#include <utility>

namespace anatomy::exact {

using Rational = mpq_class;

/// The largest exact value, in bits of numerator plus denominator (2 MiB):
/// an exact computation that grows past it is stopped with an error rather
/// than left to run for hours or to make GMP abort the process when its
/// memory runs out. The exact trace's values are a few hundred bits.
constexpr long kMaxBits = 1L << 24;
/// Bits of q's numerator plus its denominator.
long bit_size(const Rational& q);
/// Throws std::length_error naming `what` and both sizes when q is past kMaxBits.
void check_size(const Rational& q, const char* what);
/// Throws the same before computing a value estimated at `bits` bits.
void check_estimate(double bits, const char* what);

/// Parses "7", "-3/2", " 1/10 " (canonicalised), at most kMaxBits. nullopt and a reason in
/// *why for anything else: not a fraction, or a zero denominator.
std::optional<Rational> parse_rational(const std::string& text, std::string* why);

/// "3/2", "-1", "0".
std::string to_string(const Rational& q);
/// The nearest double (GMP truncates; the error is below one ulp).
double to_double(const Rational& q);

/// The exact square root when q ≥ 0 is the square of a rational (√(9/4) = 3/2).
std::optional<Rational> exact_sqrt(const Rational& q);

/// ⌊q·2^bits⌋ / 2^bits and ⌈q·2^bits⌉ / 2^bits.
Rational round_down(const Rational& q, long bits);
Rational round_up(const Rational& q, long bits);

/// [lo, hi] ∋ e^q, with hi − lo ≲ e^q · 2^−bits.
std::pair<Rational, Rational> exp_bounds(const Rational& q, long bits);
/// [lo', hi'] ∋ √x for every x in [lo, hi] (lo is clamped at 0; hi must be ≥ 0).
std::pair<Rational, Rational> sqrt_bounds(const Rational& lo, const Rational& hi, long bits);

/// A short fraction for a double that is not an integer, for error messages:
/// 0.1 → "1/10", 0.333333 → "1/3" (continued fractions, denominator ≤ 10^6).
std::string suggest_fraction(double x);

}  // namespace anatomy::exact
