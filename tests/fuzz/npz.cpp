// libFuzzer: the .npz reader (host/io/npz.cpp): the zip's directory through
// libzip, each member's .npy header, its dtype, order and shape, and the data
// inflated against the size the shape declares.
#include <ATen/ATen.h>

#include "host/io/npz.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string path = anatomy::fuzz::as_file(data, size, ".npz");
  try {
    for (const auto& [name, t] : anatomy::io::load_npz(path)) {
      if (name.empty() || !t.defined()) std::abort();  // a loaded member has a name and a tensor
    }
  } catch (const anatomy::io::NpzError& e) {
    anatomy::fuzz::require_message(e.what());
  }
  // the header parser alone, on the raw bytes (a member's first bytes)
  try {
    anatomy::io::parse_npy_header(std::string(reinterpret_cast<const char*>(data), size), size, "fuzz.npy");
  } catch (const anatomy::io::NpzError& e) {
    anatomy::fuzz::require_message(e.what());
  }
  return 0;
}
