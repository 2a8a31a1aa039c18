// What the libFuzzer targets share: the input as a file (the readers take
// paths, as users give them), and the rule every target checks. A reader
// either loads the input or raises one of the errors the bindings turn into a
// Lua error with a message; anything else escaping (another exception type,
// a crash, a sanitizer report, a hang) is a finding.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace anatomy::fuzz {

/// A file that reads short: stat gives its size as 4096 bytes, a read gives a
/// few (a sysfs file). Empty where the machine has none.
inline const char* short_read_file() {
  static const char* path = access("/sys/devices/system/cpu/online", R_OK) == 0 ? "/sys/devices/system/cpu/online" : "";
  return path;
}

/// The input written to a file of this process (overwritten each input).
/// Two inputs in 64 (by their first byte) are given to the reader as what a
/// wrong path gives instead: a directory, or a file that reads shorter than
/// its size. The readers must say so, never read an unset length or garbage.
inline std::string as_file(const uint8_t* data, size_t size, const char* suffix) {
  static std::string dir;
  if (dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/anatomy-fuzz-" + std::to_string(getpid());
    std::string mk = "mkdir -p '" + dir + "/a_directory" + suffix + "'";
    if (std::system(mk.c_str()) != 0) std::abort();
  }
  if (size > 0 && data[0] % 64 == 63) return dir + "/a_directory" + suffix;
  if (size > 0 && data[0] % 64 == 62 && *short_read_file()) return short_read_file();
  std::string path = dir + "/input" + suffix;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size) std::fwrite(data, 1, size, f);
  std::fclose(f);
  return path;
}

/// A message is part of the rule: an error without one is a finding.
inline void require_message(const char* what) {
  if (!what || !*what) std::abort();
}

}  // namespace anatomy::fuzz
