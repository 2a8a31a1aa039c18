// The Lua-visible Rational (GMP) and the certified bounds the exact trace
// needs (host/exact/rational.h). lua/anatomy/exact/ builds on torch._exact.
#include "bindings/parts.h"
#include "bindings/common.h"
#include "host/exact/rational.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace anatomy::lua {
namespace {

using exact::Rational;
constexpr const char* kRationalMeta = "anatomy.Rational";

Rational* to_rational_ud(lua_State* L, int idx) {
  return static_cast<Rational*>(luaL_testudata(L, idx, kRationalMeta));
}

// Every Rational handed to Lua is within exact::kMaxBits: a computation that
// grows without bound stops here with an error, one step past the limit.
void push_rational(lua_State* L, Rational q) {
  try {
    exact::check_size(q, "the result");
  } catch (const std::length_error& e) {
    throw CallError(e.what());
  }
  push_userdata<Rational>(L, kRationalMeta, std::move(q));
}

// A Rational from a Rational, an integer-valued number or a string "p/q".
// A number with a fractional part is refused with the fraction it likely means.
Rational check_rational(lua_State* L, int idx) {
  if (Rational* q = to_rational_ud(L, idx)) return *q;
  if (lua_type(L, idx) == LUA_TNUMBER) {
    double v = lua_tonumber(L, idx);
    if (!std::isfinite(v)) throw ArgError(idx, "expected an exact number, got " + std::to_string(v));
    if (v != std::floor(v)) {
      std::string hint = exact::suggest_fraction(v);
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.15g", v);  // the shortest form that reads back, as Lua prints it
      if (std::strtod(buf, nullptr) != v) std::snprintf(buf, sizeof buf, "%.17g", v);
      throw ArgError(idx, std::string("expected an integer or a fraction written as a string, got ") + buf +
                              (hint.empty() ? "" : " (write '" + hint + "' for an exact fraction)"));
    }
    if (std::fabs(v) > 9007199254740992.0)
      throw ArgError(idx, "integer too large to be exact as a Lua number; write it as a string");
    return Rational(mpz_class(static_cast<long>(v)));
  }
  if (lua_type(L, idx) == LUA_TSTRING) {
    std::string why;
    if (auto q = exact::parse_rational(lua_tostring(L, idx), &why)) return *q;
    throw ArgError(idx, why);
  }
  throw ArgError(idx, "Rational, integer or fraction string expected, got " + type_name(L, idx));
}

long check_bits(lua_State* L, int idx) {
  int64_t bits = check_integer(L, idx);
  if (bits < 1 || bits > 65536) throw ArgError(idx, "bits must be in 1..65536, got " + std::to_string(bits));
  return static_cast<long>(bits);
}

int rational_new(lua_State* L) {
  push_rational(L, check_rational(L, 1));
  return 1;
}

int rational_is(lua_State* L) {
  lua_pushboolean(L, to_rational_ud(L, 1) != nullptr);
  return 1;
}

int rational_add(lua_State* L) {
  push_rational(L, check_rational(L, 1) + check_rational(L, 2));
  return 1;
}
int rational_sub(lua_State* L) {
  push_rational(L, check_rational(L, 1) - check_rational(L, 2));
  return 1;
}
int rational_mul(lua_State* L) {
  push_rational(L, check_rational(L, 1) * check_rational(L, 2));
  return 1;
}
int rational_div(lua_State* L) {
  Rational a = check_rational(L, 1), b = check_rational(L, 2);
  if (sgn(b) == 0) throw CallError("division by zero");
  push_rational(L, a / b);
  return 1;
}
int rational_unm(lua_State* L) {
  push_rational(L, -check_rational(L, 1));
  return 1;
}
// q ^ n for an integer n (negative: the reciprocal's power).
int rational_pow(lua_State* L) {
  Rational q = check_rational(L, 1);
  int64_t n = check_integer(L, 2);
  if (n < -65536 || n > 65536) throw ArgError(2, "exponent must be in -65536..65536");
  if (n < 0 && sgn(q) == 0) throw CallError("division by zero (0 to a negative power)");
  try {
    exact::check_estimate(static_cast<double>(exact::bit_size(q)) * static_cast<double>(n < 0 ? -n : n), "q ^ n");
  } catch (const std::length_error& e) {
    throw CallError(e.what());
  }
  Rational r;
  mpz_pow_ui(r.get_num_mpz_t(), q.get_num_mpz_t(), static_cast<unsigned long>(n < 0 ? -n : n));
  mpz_pow_ui(r.get_den_mpz_t(), q.get_den_mpz_t(), static_cast<unsigned long>(n < 0 ? -n : n));
  if (n < 0) r = 1 / r;
  r.canonicalize();
  push_rational(L, r);
  return 1;
}
int rational_eq(lua_State* L) {
  lua_pushboolean(L, check_rational(L, 1) == check_rational(L, 2));
  return 1;
}
int rational_lt(lua_State* L) {
  lua_pushboolean(L, check_rational(L, 1) < check_rational(L, 2));
  return 1;
}
int rational_le(lua_State* L) {
  lua_pushboolean(L, check_rational(L, 1) <= check_rational(L, 2));
  return 1;
}
int rational_tostring(lua_State* L) {
  std::string s = exact::to_string(check_rational(L, 1));
  lua_pushlstring(L, s.data(), s.size());
  return 1;
}
int rational_tonumber(lua_State* L) {
  lua_pushnumber(L, exact::to_double(check_rational(L, 1)));
  return 1;
}
int rational_sign(lua_State* L) {
  lua_pushinteger(L, sgn(check_rational(L, 1)));
  return 1;
}
int rational_num(lua_State* L) {
  std::string s = check_rational(L, 1).get_num().get_str();
  lua_pushlstring(L, s.data(), s.size());
  return 1;
}
int rational_den(lua_State* L) {
  std::string s = check_rational(L, 1).get_den().get_str();
  lua_pushlstring(L, s.data(), s.size());
  return 1;
}
int rational_is_integer(lua_State* L) {
  lua_pushboolean(L, check_rational(L, 1).get_den() == 1);
  return 1;
}
int rational_abs(lua_State* L) {
  push_rational(L, abs(check_rational(L, 1)));
  return 1;
}
// q:sqrt() -> the exact root, or nil when q is not the square of a rational.
int rational_sqrt(lua_State* L) {
  Rational q = check_rational(L, 1);
  if (sgn(q) < 0) throw CallError("square root of a negative number (" + exact::to_string(q) + ")");
  if (auto r = exact::exact_sqrt(q)) {
    push_rational(L, *r);
  } else {
    lua_pushnil(L);
  }
  return 1;
}
int rational_floor(lua_State* L) {
  push_rational(L, exact::round_down(check_rational(L, 1), check_bits(L, 2)));
  return 1;
}
int rational_ceil(lua_State* L) {
  push_rational(L, exact::round_up(check_rational(L, 1), check_bits(L, 2)));
  return 1;
}

// exp_bounds(q, bits) -> lo, hi with lo ≤ e^q ≤ hi
int rational_exp_bounds(lua_State* L) {
  Rational q = check_rational(L, 1);
  long bits = check_bits(L, 2);
  std::pair<Rational, Rational> bounds;
  try {
    bounds = exact::exp_bounds(q, bits);
  } catch (const std::length_error& e) {
    throw CallError(e.what());
  } catch (const std::invalid_argument& e) {
    throw ArgError(1, std::string(e.what()).substr(std::string("exp_bounds: ").size()));
  }
  auto& [lo, hi] = bounds;
  push_rational(L, lo);
  push_rational(L, hi);
  return 2;
}

// sqrt_bounds(lo, hi, bits) -> lo', hi' with lo' ≤ √x ≤ hi' for x in [lo, hi]
int rational_sqrt_bounds(lua_State* L) {
  Rational lo = check_rational(L, 1), hi = check_rational(L, 2);
  long bits = check_bits(L, 3);
  if (sgn(hi) < 0) throw ArgError(2, "the interval is negative (upper bound " + exact::to_string(hi) + ")");
  auto [a, b] = exact::sqrt_bounds(lo, hi, bits);
  push_rational(L, a);
  push_rational(L, b);
  return 2;
}

// suggest(x) -> "p/q" close to x, or nil
int rational_suggest(lua_State* L) {
  std::string s = exact::suggest_fraction(check_number(L, 1));
  if (s.empty()) return 0;
  lua_pushstring(L, s.c_str());
  return 1;
}

const luaL_Reg rational_methods[] = {
    {"tonumber", guarded<rational_tonumber>}, {"sign", guarded<rational_sign>},
    {"num", guarded<rational_num>},           {"den", guarded<rational_den>},
    {"is_integer", guarded<rational_is_integer>}, {"abs", guarded<rational_abs>},
    {"sqrt", guarded<rational_sqrt>},         {"floor", guarded<rational_floor>},
    {"ceil", guarded<rational_ceil>},         {nullptr, nullptr},
};

const luaL_Reg rational_meta[] = {
    {"__add", guarded<rational_add>}, {"__sub", guarded<rational_sub>}, {"__mul", guarded<rational_mul>},
    {"__div", guarded<rational_div>}, {"__unm", guarded<rational_unm>}, {"__pow", guarded<rational_pow>},
    {"__eq", guarded<rational_eq>},   {"__lt", guarded<rational_lt>},   {"__le", guarded<rational_le>},
    {"__tostring", guarded<rational_tostring>}, {nullptr, nullptr},
};

const luaL_Reg exact_functions[] = {
    {"new", guarded<rational_new>},
    {"is_rational", guarded<rational_is>},
    {"exp_bounds", guarded<rational_exp_bounds>},
    {"sqrt_bounds", guarded<rational_sqrt_bounds>},
    {"suggest", guarded<rational_suggest>},
    {nullptr, nullptr},
};

}  // namespace

int luaopen_anatomy_rational(lua_State* L) {
  define_userdata<Rational>(L, kRationalMeta, "Rational", rational_methods);
  luaL_getmetatable(L, kRationalMeta);
  luaL_register(L, nullptr, rational_meta);
  lua_pop(L, 1);
  lua_newtable(L);
  luaL_register(L, nullptr, exact_functions);
  return 1;
}

}  // namespace anatomy::lua
