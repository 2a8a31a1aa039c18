// libFuzzer: the exact trace's rational parser (host/exact/rational.cpp):
// a fraction parses and prints back to something that parses to the same
// value; anything else is refused with a reason.
#include "host/exact/rational.h"
#include "tests/fuzz/fuzz_common.h"

#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  std::string why;
  auto q = anatomy::exact::parse_rational(text, &why);
  if (!q) {
    anatomy::fuzz::require_message(why.c_str());
    return 0;
  }
  std::string again;
  auto back = anatomy::exact::parse_rational(anatomy::exact::to_string(*q), &again);
  if (!back || *back != *q) std::abort();  // printing and parsing must round-trip
  return 0;
}
