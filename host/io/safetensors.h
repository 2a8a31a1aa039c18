// safetensors files: an 8-byte little-endian header length, a JSON header
// naming each tensor's dtype, shape and byte range, then the raw data. The
// format PyTorch and Hugging Face tools read; never pickle.
#pragma once
#include <ATen/core/Tensor.h>

#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace anatomy::io {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

/// A file that is not valid safetensors, or a tensor that cannot be stored.
struct SafetensorsError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct SafetensorsFile {
  NamedTensors tensors;                          ///< in file order
  std::map<std::string, std::string> metadata;   ///< the header's "__metadata__"
};

/// Writes tensors (in the given order) to a temporary file beside `path`,
/// then renames it into place: an error never leaves a partial file.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// Reads and validates a whole file: header length, JSON, dtypes, shapes and
/// byte ranges (inside the data, no overlaps, sizes matching shapes).
SafetensorsFile load_safetensors(const std::string& path);

}  // namespace anatomy::io
