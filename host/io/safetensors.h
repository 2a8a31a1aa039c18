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
/// fsyncs it and renames it into place (io::write_atomic): an error or a kill
/// never leaves a partial file at `path`.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// A file's validated header: each tensor's dtype, shape and byte range, read
/// without its data (safetensors' safe_open), for loading one tensor at a time.
struct SafetensorsIndex {
  struct Entry {
    std::string name;
    c10::ScalarType type;
    std::vector<int64_t> shape;
    uint64_t begin, end;  ///< byte range within the data
  };
  std::string path;
  uint64_t data_start = 0;                      ///< where the data begins in the file
  std::vector<Entry> entries;                   ///< in file order
  std::map<std::string, std::string> metadata;  ///< the header's "__metadata__"
  /// The entry of a tensor, or nullptr.
  const Entry* find(const std::string& name) const;
};

/// Reads and validates a file's header: header length, JSON, dtypes, shapes and
/// byte ranges (inside the data, no overlaps, sizes matching shapes).
SafetensorsIndex open_safetensors(const std::string& path);
/// One tensor's data (CPU), read from the file.
at::Tensor read_tensor(const SafetensorsIndex& index, const SafetensorsIndex::Entry& entry);
/// One tensor's data read straight into `out` (a contiguous CPU tensor of the
/// entry's dtype and shape), with no buffer between. Throws SafetensorsError
/// naming the mismatch otherwise.
void read_tensor_into(const SafetensorsIndex& index, const SafetensorsIndex::Entry& entry, at::Tensor& out);
/// open_safetensors, then every tensor read.
SafetensorsFile load_safetensors(const std::string& path);

}  // namespace anatomy::io
