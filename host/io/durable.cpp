// Crash-safe writes (see durable.h): temporary file, fsync, rename, folder fsync.
#include "host/io/durable.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>

namespace anatomy::io {
namespace {

std::string quoted(const std::string& s) { return "'" + s + "'"; }

[[noreturn]] void fail(const std::string& path, int error) {
  throw WriteError("cannot write " + quoted(path) + ": " + std::strerror(error));
}

// The folder holding path, and the file's own name in it.
std::pair<std::string, std::string> split(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return {".", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

// fsync of a folder makes the names in it (a rename) durable. Some file
// systems do not sync folders (EINVAL); there the rename is as durable as they allow.
int sync_dir(const std::string& dir) {
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno;
  int rc = fsync(fd) == 0 || errno == EINVAL || errno == EROFS ? 0 : errno;
  close(fd);
  return rc;
}

}  // namespace

void Sink::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0 && error_ == 0) {
    ssize_t k = ::write(fd_, p, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      error_ = errno;
      return;
    }
    p += k;
    n -= static_cast<size_t>(k);
    written_ += static_cast<size_t>(k);
  }
}

int remove_stale_temporaries(const std::string& path) {
  auto [dir, name] = split(path);
  const std::string prefix = name + ".tmp.";
  DIR* d = opendir(dir.c_str());
  if (!d) return 0;
  int removed = 0;
  while (dirent* e = readdir(d)) {
    std::string entry = e->d_name;
    if (entry.size() <= prefix.size() || entry.compare(0, prefix.size(), prefix) != 0) continue;
    std::string digits = entry.substr(prefix.size());
    if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    pid_t pid = static_cast<pid_t>(std::strtol(digits.c_str(), nullptr, 10));
    if (pid == getpid()) continue;
    // ESRCH: no such process, so its writer died before the rename. (EPERM:
    // the process runs under another user; leave its file alone.)
    if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
      if (unlink((dir + "/" + entry).c_str()) == 0) ++removed;
    }
  }
  closedir(d);
  return removed;
}

void write_atomic(const std::string& path, const std::function<void(Sink&)>& fill) {
  if (path.empty()) throw WriteError("cannot write a file with an empty path");
  remove_stale_temporaries(path);
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  // a link planted at the temporary's (guessable) name is removed, never
  // followed: the bytes go only where path says
  unlink(tmp.c_str());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd < 0) fail(path, errno);
  Sink sink(fd);
  int error = 0;
  try {
    fill(sink);
  } catch (const std::exception&) {  // the writer's own failure: no partial file stays
    close(fd);
    unlink(tmp.c_str());
    throw;
  }
  error = sink.error();
  if (error == 0 && fsync(fd) != 0) error = errno;
  if (close(fd) != 0 && error == 0) error = errno;
  if (error == 0 && std::rename(tmp.c_str(), path.c_str()) != 0) error = errno;
  if (error != 0) {
    unlink(tmp.c_str());
    fail(path, error);
  }
  if (int e = sync_dir(split(path).first)) fail(path, e);
}

void write_atomic(const std::string& path, const void* data, size_t n) {
  write_atomic(path, [&](Sink& sink) {
    size_t half = n / 2;
    sink.write(data, half);
    pause_mid_write();
    sink.write(static_cast<const char*>(data) + half, n - half);
  });
}

void sync_file(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, errno);
  int error = fsync(fd) == 0 ? 0 : errno;
  close(fd);
  if (error) fail(path, error);
}

void pause_mid_write() {
  static const long ms = [] {
    const char* v = std::getenv("ANATOMY_TEST_WRITE_PAUSE");
    return v ? std::strtol(v, nullptr, 10) : 0L;
  }();
  if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

}  // namespace anatomy::io
