// NumPy's .npz files (np.savez, np.savez_compressed): a zip archive of .npy
// members, each a small header (magic, version, a Python dict literal giving
// 'descr', 'fortran_order' and 'shape') then the raw array. Gemma Scope ships
// its dictionaries this way. The zip is read with libzip; the .npy header is
// parsed here, and only plain numeric arrays are accepted (never a pickle).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace anatomy::io {

/// A file that is not a plain-array .npz, or arrays that cannot be stored.
struct NpzError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A .npy header, parsed and checked.
struct NpyHeader {
  c10::ScalarType type = at::kFloat;  ///< the tensor's dtype (b1 is kBool)
  bool byte_swap = false;             ///< big-endian data ('>f4'), swapped on reading
  bool fortran_order = false;         ///< column-major data
  std::vector<int64_t> shape;
  uint64_t header_bytes = 0;          ///< magic, length field and header text
  uint64_t data_bytes = 0;            ///< numel times the item size
};

/// Parses the header at the start of a .npy member. `bytes` holds at least
/// the first min(n, 10 + 64 KiB) bytes of the member; `member_size` is its
/// full (uncompressed) size, which must be header_bytes + data_bytes exactly.
/// NpzError names `where` (file and member) and what is wrong otherwise.
NpyHeader parse_npy_header(const std::string& bytes, uint64_t member_size, const std::string& where);

/// The most header bytes a member may have (numpy writes tens).
constexpr uint64_t kMaxNpyHeader = 65536;

/// Reads every array of an .npz (stored or deflated members), in archive
/// order, named without '.npy'. Refuses: members that are not .npy, names
/// that are empty, absolute or hold '.', '..', '\\' or control characters,
/// duplicate names, encrypted members or other compression methods, and any
/// .npy that parse_npy_header refuses; sizes are checked before anything is
/// allocated, and the inflated bytes must match the declared size exactly.
std::vector<std::pair<std::string, at::Tensor>> load_npz(const std::string& path);

/// Writes tensors as np.savez (compressed: np.savez_compressed) would, each
/// as '<name>.npy' (.npy version 1.0, little-endian, C order), to a
/// temporary file beside `path` renamed into place (io::write_atomic).
/// bfloat16 has no numpy dtype and is refused.
void save_npz(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
              bool compressed = false);

}  // namespace anatomy::io
