// Exact rationals and certified bounds (see rational.h).
#include "host/exact/rational.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace anatomy::exact {
namespace {

bool parse_integer(const std::string& s, mpz_class* out) {
  size_t i = 0;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
  if (i == s.size()) return false;
  for (size_t j = i; j < s.size(); ++j)
    if (!std::isdigit(static_cast<unsigned char>(s[j]))) return false;
  std::string digits = s[0] == '+' ? s.substr(1) : s;
  return out->set_str(digits, 10) == 0;
}

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// ⌊√n⌋ and ⌈√n⌉ for n ≥ 0.
mpz_class isqrt_floor(const mpz_class& n) {
  mpz_class r;
  mpz_sqrt(r.get_mpz_t(), n.get_mpz_t());
  return r;
}
mpz_class isqrt_ceil(const mpz_class& n) {
  mpz_class r = isqrt_floor(n);
  if (r * r < n) r += 1;
  return r;
}

Rational dyadic(const mpz_class& m, long bits) {
  Rational q(m, 1);
  mpq_div_2exp(q.get_mpq_t(), q.get_mpq_t(), bits);
  q.canonicalize();
  return q;
}

}  // namespace

long bit_size(const Rational& q) {
  return static_cast<long>(mpz_sizeinbase(q.get_num_mpz_t(), 2) + mpz_sizeinbase(q.get_den_mpz_t(), 2));
}

void check_estimate(double bits, const char* what) {
  if (bits <= static_cast<double>(kMaxBits)) return;
  char size[64] = "an astronomical number of";
  if (std::isfinite(bits)) std::snprintf(size, sizeof size, "about %.4g", bits);
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "%s would be an exact value of %s bits, past the limit of %ld bits "
                "(numerator and denominator): the computation grows without bound",
                what, size, kMaxBits);
  throw std::length_error(buf);
}

void check_size(const Rational& q, const char* what) { check_estimate(static_cast<double>(bit_size(q)), what); }

std::optional<Rational> parse_rational(const std::string& text, std::string* why) {
  std::string s = trim(text);
  if (static_cast<double>(s.size()) * 3.33 > static_cast<double>(kMaxBits)) {
    *why = "a fraction of " + std::to_string(s.size()) + " characters is past the limit of " +
           std::to_string(kMaxBits) + " bits an exact value may have";
    return std::nullopt;
  }
  size_t slash = s.find('/');
  mpz_class num, den = 1;
  bool ok = slash == std::string::npos ? parse_integer(s, &num)
                                       : parse_integer(trim(s.substr(0, slash)), &num) &&
                                             parse_integer(trim(s.substr(slash + 1)), &den);
  if (!ok) {
    *why = "'" + text + "' is not an integer or a fraction p/q";
    return std::nullopt;
  }
  if (den == 0) {
    *why = "'" + text + "' has a zero denominator";
    return std::nullopt;
  }
  Rational q(num, den);
  q.canonicalize();
  return q;
}

std::string to_string(const Rational& q) { return q.get_str(10); }

// GMP's get_d truncates toward zero; of it and its neighbour away from zero,
// take the nearer (ties: either; both are within half an ulp then).
double to_double(const Rational& q) {
  double t = q.get_d();
  if (!std::isfinite(t)) return t;
  double away = std::nextafter(t, sgn(q) >= 0 ? INFINITY : -INFINITY);
  if (!std::isfinite(away)) return t;
  Rational dt(t), da(away);
  return abs(q - dt) <= abs(q - da) ? t : away;
}

std::optional<Rational> exact_sqrt(const Rational& q) {
  if (sgn(q) < 0) return std::nullopt;
  const mpz_class& n = q.get_num();
  const mpz_class& d = q.get_den();
  if (!mpz_perfect_square_p(n.get_mpz_t()) || !mpz_perfect_square_p(d.get_mpz_t())) return std::nullopt;
  Rational r(isqrt_floor(n), isqrt_floor(d));
  r.canonicalize();
  return r;
}

Rational round_down(const Rational& q, long bits) {
  mpz_class scaled = q.get_num();
  mpz_mul_2exp(scaled.get_mpz_t(), scaled.get_mpz_t(), bits);
  mpz_class m;
  mpz_fdiv_q(m.get_mpz_t(), scaled.get_mpz_t(), q.get_den().get_mpz_t());
  return dyadic(m, bits);
}

Rational round_up(const Rational& q, long bits) {
  mpz_class scaled = q.get_num();
  mpz_mul_2exp(scaled.get_mpz_t(), scaled.get_mpz_t(), bits);
  mpz_class m;
  mpz_cdiv_q(m.get_mpz_t(), scaled.get_mpz_t(), q.get_den().get_mpz_t());
  return dyadic(m, bits);
}

// e^q = (e^r)^(2^k) with r = q / 2^k, |r| ≤ 1/2. e^r is the Taylor sum up to
// the first term t below 2^−(w+2); the tail Σ t·r^j/... is at most 2|t|
// because each further term is at most half the previous one. Squaring k times
// multiplies the relative width by about 2^k, which the working precision w covers.
std::pair<Rational, Rational> exp_bounds(const Rational& q, long bits) {
  if (sgn(q) == 0) return {Rational(1), Rational(1)};
  if (bits < 1 || bits > 1 << 16) throw std::invalid_argument("exp_bounds: bits out of range");
  // e^q for q > 0 has about q·log2(e) bits before the point
  if (sgn(q) > 0) check_estimate(to_double(q) * 1.4426950408889634 + static_cast<double>(bits), "e^q");
  Rational r = q;
  long k = 0;
  const Rational half(1, 2);
  while (abs(r) > half) {
    mpq_div_2exp(r.get_mpq_t(), r.get_mpq_t(), 1);
    if (++k > 4096) throw std::invalid_argument("exp_bounds: exponent too large (|q| > 2^4095)");
  }
  const long w = bits + k + 16;
  Rational limit(1);
  mpq_div_2exp(limit.get_mpq_t(), limit.get_mpq_t(), w + 2);
  Rational sum(0), term(1);
  for (long n = 1;; ++n) {
    sum += term;
    term *= r;
    term /= n;
    if (abs(term) < limit) break;
  }
  Rational tail = 2 * abs(term) + limit;
  Rational lo = round_down(sum - tail, w), hi = round_up(sum + tail, w);
  for (long i = 0; i < k; ++i) {
    lo = round_down(lo * lo, w);
    hi = round_up(hi * hi, w);
  }
  return {lo, hi};
}

std::pair<Rational, Rational> sqrt_bounds(const Rational& lo, const Rational& hi, long bits) {
  if (sgn(hi) < 0) throw std::invalid_argument("sqrt_bounds: the interval is negative");
  Rational a = sgn(lo) < 0 ? Rational(0) : lo;
  // √x = √(x·4^w) / 2^w; round x·4^w down (up) before the integer root.
  mpz_class low = a.get_num(), high = hi.get_num();
  mpz_mul_2exp(low.get_mpz_t(), low.get_mpz_t(), 2 * bits);
  mpz_mul_2exp(high.get_mpz_t(), high.get_mpz_t(), 2 * bits);
  mpz_fdiv_q(low.get_mpz_t(), low.get_mpz_t(), a.get_den().get_mpz_t());
  mpz_cdiv_q(high.get_mpz_t(), high.get_mpz_t(), hi.get_den().get_mpz_t());
  return {dyadic(isqrt_floor(low), bits), dyadic(isqrt_ceil(high), bits)};
}

std::string suggest_fraction(double x) {
  // Past 2^53 every double is an integer, and a numerator that large is no
  // help in a message (the products below would also leave long long's range).
  if (!std::isfinite(x) || std::fabs(x) > 9007199254740992.0) return "";
  // Convergents h/k of the continued fraction of x until |x − h/k| < 1e-9·|x|,
  // formed in doubles (exact below 2^53) and stopped before they leave it.
  double value = x;
  long long h0 = 1, h1 = 0, k0 = 0, k1 = 1;  // h_{-1}, h_{-2}, k_{-1}, k_{-2}
  for (int i = 0; i < 40; ++i) {
    double a = std::floor(value);
    double hd = a * static_cast<double>(h0) + static_cast<double>(h1), kd = a * static_cast<double>(k0) + static_cast<double>(k1);
    if (!(kd <= 1000000) || !(std::fabs(hd) <= 9007199254740992.0)) break;
    long long h = static_cast<long long>(hd), k = static_cast<long long>(kd);
    h1 = h0, h0 = h, k1 = k0, k0 = k;
    if (std::fabs(x - static_cast<double>(h) / k) <= 1e-9 * std::fabs(x)) break;
    double frac = value - a;
    if (frac < 1e-12) break;
    value = 1 / frac;
  }
  if (k0 == 0 || (h0 == 0 && x != 0)) return "";  // no fraction with a denominator up to 10^6 comes close
  return std::to_string(h0) + "/" + std::to_string(k0);
}

}  // namespace anatomy::exact
