// libFuzzer: the safetensors reader (host/io/safetensors.cpp): the header,
// every entry's dtype, shape and offsets, and each tensor's data.
#include <ATen/ATen.h>

#include "host/io/safetensors.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string path = anatomy::fuzz::as_file(data, size, ".safetensors");
  try {
    anatomy::io::SafetensorsIndex index = anatomy::io::open_safetensors(path);
    for (const auto& e : index.entries) anatomy::io::read_tensor(index, e);
  } catch (const anatomy::io::SafetensorsError& e) {
    anatomy::fuzz::require_message(e.what());
  }
  return 0;
}
