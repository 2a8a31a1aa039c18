// File facts for provenance records (see digest.h). SHA-256 is OpenSSL's
// (libssl-dev), through its EVP interface.
#include "host/io/digest.h"

#include <openssl/evp.h>
#include <sys/stat.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

namespace anatomy::io {
namespace {

struct DigestContext {
  explicit DigestContext(const EVP_MD* md = EVP_sha256()) : ctx(EVP_MD_CTX_new()) {
    if (!ctx || EVP_DigestInit_ex(ctx, md, nullptr) != 1) throw std::runtime_error("cannot start a digest");
  }
  ~DigestContext() { EVP_MD_CTX_free(ctx); }
  DigestContext(const DigestContext&) = delete;
  DigestContext& operator=(const DigestContext&) = delete;

  void update(const void* data, size_t n) {
    if (EVP_DigestUpdate(ctx, data, n) != 1) throw std::runtime_error("SHA-256 digest failed");
  }
  std::string hex() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    if (EVP_DigestFinal_ex(ctx, md, &n) != 1) throw std::runtime_error("SHA-256 digest failed");
    static const char digits[] = "0123456789abcdef";
    std::string out(2 * n, '0');
    for (unsigned int i = 0; i < n; ++i) {
      out[2 * i] = digits[md[i] >> 4];
      out[2 * i + 1] = digits[md[i] & 0xf];
    }
    return out;
  }

  EVP_MD_CTX* ctx;
};

}  // namespace

std::string sha256_hex(std::string_view bytes) {
  DigestContext d;
  d.update(bytes.data(), bytes.size());
  return d.hex();
}

std::string sha256_hex(const std::vector<std::string_view>& pieces) {
  DigestContext d;
  for (std::string_view piece : pieces) d.update(piece.data(), piece.size());
  return d.hex();
}

std::string real_path(const std::string& path) {
  std::unique_ptr<char, decltype(&std::free)> resolved(::realpath(path.c_str(), nullptr), &std::free);
  if (!resolved) throw std::runtime_error("cannot resolve '" + path + "': " + std::strerror(errno));
  return resolved.get();
}

std::string not_a_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "";  // missing: the reader's open says so, in its own words
  if (S_ISREG(st.st_mode)) return "";
  if (S_ISDIR(st.st_mode)) return "is a directory";
  const char* kind = S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISCHR(st.st_mode) ? "a character device"
                     : S_ISBLK(st.st_mode) ? "a block device" : S_ISSOCK(st.st_mode) ? "a socket" : "not a file";
  return std::string("is not a regular file (") + kind + ")";
}

void check_regular_file(const std::string& path) {
  std::string why = not_a_file(path);
  if (!why.empty()) throw std::runtime_error("'" + path + "' " + why);
}

std::string read_whole_file(const std::string& path) {
  check_regular_file(path);
  std::unique_ptr<FILE, decltype(&std::fclose)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw std::runtime_error("cannot open '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fileno(f.get()), &st) != 0) throw std::runtime_error("cannot stat '" + path + "': " + std::strerror(errno));
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t n = out.empty() ? 0 : std::fread(out.data(), 1, out.size(), f.get());
  if (n != out.size())
    throw std::runtime_error("cannot read '" + path + "': " + std::to_string(n) + " of its " + std::to_string(out.size()) +
                             " bytes came" + (std::ferror(f.get()) ? std::string(" (") + std::strerror(errno) + ")" : ""));
  return out;
}

std::string file_digest(const std::string& path, const std::string& kind) {
  if (kind != "sha256" && kind != "git-sha1")
    throw std::runtime_error("digest kind must be 'sha256' or 'git-sha1', got '" + kind + "'");
  check_regular_file(path);
  std::unique_ptr<FILE, decltype(&std::fclose)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw std::runtime_error("cannot open '" + path + "': " + std::strerror(errno));
  DigestContext d(kind == "sha256" ? EVP_sha256() : EVP_sha1());
  if (kind == "git-sha1") {  // git hashes "blob <size>\0" and then the bytes
    struct stat st {};
    if (::fstat(fileno(f.get()), &st) != 0) throw std::runtime_error("cannot stat '" + path + "': " + std::strerror(errno));
    std::string header = "blob " + std::to_string(static_cast<long long>(st.st_size));
    d.update(header.data(), header.size() + 1);  // with its terminating NUL
  }
  std::vector<char> buffer(1 << 20);
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), f.get())) > 0) d.update(buffer.data(), n);
  if (std::ferror(f.get())) throw std::runtime_error("cannot read '" + path + "': " + std::strerror(errno));
  return d.hex();
}

FileInfo file_info(const std::string& path) {
  FileInfo info;
  check_regular_file(path);
  info.path = real_path(path);
  std::unique_ptr<FILE, decltype(&std::fclose)> f(std::fopen(info.path.c_str(), "rb"), &std::fclose);
  if (!f) throw std::runtime_error("cannot open '" + path + "': " + std::strerror(errno));
  DigestContext d;
  std::vector<char> buffer(1 << 20);
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), f.get())) > 0) {
    d.update(buffer.data(), n);
    info.bytes += static_cast<int64_t>(n);
  }
  if (std::ferror(f.get())) throw std::runtime_error("cannot read '" + path + "': " + std::strerror(errno));
  info.sha256 = d.hex();
  return info;
}

}  // namespace anatomy::io
