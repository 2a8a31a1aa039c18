// Files that survive a crash: every file anatomy writes for a user
// (checkpoints, safetensors, reports, results, the metrics log) is either the
// old version or the new one after a kill -9 or a power cut, never a mix.
#pragma once
#include <cstddef>
#include <functional>
#include <stdexcept>
#include <string>

namespace anatomy::io {

/// A write that failed; the message names the path and the system's reason.
struct WriteError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Where a writer puts its bytes. The first failure is kept and reported by
/// write_atomic; later writes are skipped.
class Sink {
 public:
  explicit Sink(int fd) : fd_(fd) {}
  void write(const void* data, size_t n);
  int error() const { return error_; }
  size_t written() const { return written_; }

 private:
  int fd_;
  int error_ = 0;
  size_t written_ = 0;
};

/// Writes `path` through `fill`: the bytes go to a temporary file beside it
/// (`path.tmp.<pid>`), which is fsynced, renamed over `path`, and then the
/// folder is fsynced so that the rename itself is durable. On any error the
/// temporary file is removed and WriteError names the path; `path` keeps its
/// old content. Temporary files that writers killed before their rename left
/// beside `path` (their process no longer runs) are removed first.
void write_atomic(const std::string& path, const std::function<void(Sink&)>& fill);
/// The same, for bytes already in memory.
void write_atomic(const std::string& path, const void* data, size_t n);

/// Forces a file's written data (an appended log) to disk. WriteError if the
/// file cannot be opened or synced.
void sync_file(const std::string& path);

/// Removes `path.tmp.<pid>` files beside `path` whose writer process is gone;
/// returns how many were removed.
int remove_stale_temporaries(const std::string& path);

/// A test hook: when the environment variable ANATOMY_TEST_WRITE_PAUSE holds
/// a number of milliseconds, writers call this halfway through their data and
/// sleep that long, so a test can kill the process while a file is half written.
void pause_mid_write();

}  // namespace anatomy::io
