// File facts for provenance records: where a file really is, how big it is
// and its SHA-256, so that a result can say exactly which data produced it.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace anatomy::io {

/// What a provenance record says about one file.
struct FileInfo {
  std::string path;    ///< absolute, symbolic links resolved
  int64_t bytes = 0;   ///< size in bytes
  std::string sha256;  ///< 64 lowercase hex digits
};

/// SHA-256 of bytes in memory, as 64 lowercase hex digits.
std::string sha256_hex(std::string_view bytes);
/// SHA-256 of pieces of memory read one after the other (as if
/// concatenated, without copying them into one buffer).
std::string sha256_hex(const std::vector<std::string_view>& pieces);

/// The absolute path of an existing file or folder (symbolic links resolved);
/// throws std::runtime_error naming the path and the reason otherwise.
std::string real_path(const std::string& path);

/// Why `path` cannot be read as a file: "" when it is a regular file, else
/// "is a directory", "is not a regular file (a FIFO)", ... ("" too when it
/// does not exist: opening it then says so). Readers ask before they read: a
/// directory opens as a stream on Linux and reads as nothing, or fails
/// later with a message about its (absent) contents.
std::string not_a_file(const std::string& path);
/// Throws std::runtime_error("'PATH' is a directory", ...) unless `path` is a
/// regular file; `what` names it for the reader ("safetensors file").
void check_regular_file(const std::string& path);
/// The bytes of a regular file, every one of them read (a short read is an
/// error naming the path and how many bytes came).
std::string read_whole_file(const std::string& path);

/// The digest of a regular file's bytes as lowercase hex: kind "sha256", or
/// "git-sha1" (git's object id of the file as a blob: SHA-1 of "blob <size>\0"
/// and the bytes, what the Hugging Face Hub sends as the ETag of a file kept
/// in git rather than LFS). Throws std::runtime_error naming the path.
std::string file_digest(const std::string& path, const std::string& kind);

/// Path, size and SHA-256 of a regular file, read in 1 MiB pieces; throws
/// std::runtime_error naming the path and the reason when it cannot be read.
FileInfo file_info(const std::string& path);

}  // namespace anatomy::io
