// safetensors: every dtype round-trips; malformed files give a clear error
// and never a crash or an over-read; a failed write leaves no file behind
// and the previous file intact.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "host/io/safetensors.h"

#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <iterator>

#include <cstdio>
#include <fstream>
#include <string>

using anatomy::io::load_safetensors;
using anatomy::io::save_safetensors;
using anatomy::io::SafetensorsError;

namespace {

std::string temp_path(const std::string& name) {
  return "/tmp/anatomy_st_" + std::to_string(getpid()) + "_" + name + ".safetensors";
}

// Writes a file from a header text and `data_bytes` zero bytes.
std::string write_raw(const std::string& name, const std::string& header, size_t data_bytes, int64_t length_field = -1) {
  std::string path = temp_path(name);
  std::ofstream f(path, std::ios::binary);
  uint64_t n = length_field < 0 ? header.size() : static_cast<uint64_t>(length_field);
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>((n >> (8 * i)) & 0xff));
  f << header << std::string(data_bytes, '\0');
  return path;
}

// The error message from loading `path`.
std::string load_error(const std::string& path) {
  try {
    load_safetensors(path);
  } catch (const SafetensorsError& e) {
    std::remove(path.c_str());
    return e.what();
  }
  std::remove(path.c_str());
  return "(no error)";
}

bool exists(const std::string& path) { return std::ifstream(path).good(); }

}  // namespace

TEST_CASE("every dtype round-trips with metadata", "[safetensors]") {
  std::string path = temp_path("roundtrip");
  anatomy::io::NamedTensors in = {
      {"f32", at::randn({2, 3})},
      {"f64", at::randn({4}, at::kDouble)},
      {"f16", at::randn({3}).to(at::kHalf)},
      {"bf16", at::randn({3}).to(at::kBFloat16)},
      {"i64", at::arange(5)},
      {"i32", at::arange(3).to(at::kInt)},
      {"u8", at::arange(4).to(at::kByte)},
      {"bool", at::arange(4).gt(1)},
      {"scalar", at::scalar_tensor(2.5)},
      {"empty", at::zeros({0, 3})},
      {"strided", at::randn({3, 4}).t()},
  };
  save_safetensors(path, in, {{"format", "anatomy"}});
  auto file = load_safetensors(path);
  std::remove(path.c_str());
  CHECK(file.metadata.at("format") == "anatomy");
  REQUIRE(file.tensors.size() == in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    INFO(in[i].first);
    CHECK(file.tensors[i].first == in[i].first);  // file order is the order written
    CHECK(file.tensors[i].second.scalar_type() == in[i].second.scalar_type());
    CHECK(file.tensors[i].second.sizes() == in[i].second.sizes());
    CHECK(at::equal(file.tensors[i].second, in[i].second));
  }
}

TEST_CASE("malformed files give clear errors", "[safetensors]") {
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  SECTION("shorter than the length field") {
    std::string path = temp_path("short");
    std::ofstream(path) << "abc";
    CHECK(load_error(path) == "'" + path + "' is not a valid safetensors file: it is 3 bytes long, shorter than the 8-byte header length");
  }
  // A file written from a header text and data bytes, and a part of the error it gives.
  struct Malformed {
    const char* section;
    const char* name;
    std::string header;
    size_t data_bytes;
    int64_t length_field;  // -1: the header's own length
    const char* error;
  };
  const Malformed cases[] = {
      {"header length past the end", "pastend", ok, 8, 1000, "the header length 1000 runs past the end of the file"},
      {"header that is not JSON", "json", "{not json", 0, -1, "the header is not JSON"},
      {"truncated data", "truncated", ok, 4, -1, "tensor 'a' has data_offsets [0, 8] outside the 4 data bytes"},
      {"offsets out of bounds", "bounds", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 8, -1,
       "tensor 'a' has data_offsets [8, 16] outside the 8 data bytes"},
      {"overlapping tensors", "overlap",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8, -1,
       "tensors 'a' and 'b' overlap"},
      {"unknown dtype", "dtype", R"({"a":{"dtype":"F8","shape":[2],"data_offsets":[0,2]}})", 2, -1,
       "tensor 'a' has unknown dtype \"F8\""},
      {"shape and size disagree", "size", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, -1,
       "tensor 'a' of shape [3] needs 12 bytes but its data_offsets span 8"},
      {"negative size", "negative", R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, -1,
       "has a negative or non-integer size"},
      {"a shape too large to exist", "huge", R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})",
       8, -1, "has a shape too large to exist"},
      {"missing fields", "fields", R"({"a":{"dtype":"F32","shape":[2]}})", 8, -1, "tensor 'a' lacks dtype, shape or data_offsets"},
  };
  for (const Malformed& c : cases) {
    DYNAMIC_SECTION(c.section) {
      std::string path = write_raw(c.name, c.header, c.data_bytes, c.length_field);
      CHECK(load_error(path).find(c.error) != std::string::npos);
    }
  }
  SECTION("a file that does not exist") {
    CHECK(load_error("/no/such/file.safetensors").find("cannot open '/no/such/file.safetensors'") != std::string::npos);
  }
}

TEST_CASE("bool data other than 0 and 1 loads as true", "[safetensors]") {
  std::string path = temp_path("bool");
  {
    std::ofstream f(path, std::ios::binary);
    std::string header = R"({"b":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})";
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) f.put(static_cast<char>((n >> (8 * i)) & 0xff));
    f << header << '\0' << '\x01' << '\x07';
  }
  auto file = load_safetensors(path);
  std::remove(path.c_str());
  CHECK(at::equal(file.tensors[0].second, at::tensor({0, 1, 1}).to(at::kBool)));
}

TEST_CASE("a failed write leaves no partial file and the previous file intact", "[safetensors]") {
  std::string dir_missing = "/tmp/anatomy_no_such_dir_" + std::to_string(getpid()) + "/x.safetensors";
  CHECK_THROWS_WITH(save_safetensors(dir_missing, {{"a", at::ones({2})}}),
                    Catch::Contains("cannot write '" + dir_missing + "'"));
  CHECK_FALSE(exists(dir_missing));

  std::string path = temp_path("keep");
  save_safetensors(path, {{"a", at::ones({2})}});
  // A tensor that cannot be stored fails before anything is written.
  CHECK_THROWS_WITH(save_safetensors(path, {{"a", at::ones({2})}, {"c", at::ones({2}, at::kComplexFloat)}}),
                    Catch::Contains("cannot be stored in safetensors"));
  auto file = load_safetensors(path);
  CHECK(at::equal(file.tensors[0].second, at::ones({2})));
  CHECK_FALSE(exists(path + ".tmp." + std::to_string(getpid())));
  std::remove(path.c_str());
}

TEST_CASE("a write that fails midway keeps the previous file", "[safetensors]") {
  // A file-size limit (RLIMIT_FSIZE, SIGXFSZ ignored) makes the data write
  // fail with EFBIG after the temporary file was opened and partly written.
  std::string path = temp_path("full");
  save_safetensors(path, {{"a", at::ones({2})}});
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  struct rlimit before {};
  REQUIRE(getrlimit(RLIMIT_FSIZE, &before) == 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = before;
  small.rlim_cur = 4096;
  REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
  CHECK_THROWS_WITH(save_safetensors(path, {{"a", at::zeros({1 << 16})}}), Catch::Contains("File too large"));
  setrlimit(RLIMIT_FSIZE, &before);
  std::signal(SIGXFSZ, old_handler);
  CHECK(at::equal(load_safetensors(path).tensors[0].second, at::ones({2})));
  CHECK_FALSE(exists(tmp));
  std::remove(path.c_str());
}

TEST_CASE("a link planted at the temporary file's name is removed, not written through", "[safetensors]") {
  std::string path = temp_path("planted");
  std::string victim = temp_path("victim");
  { std::ofstream(victim) << "keep"; }
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  REQUIRE(symlink(victim.c_str(), tmp.c_str()) == 0);
  save_safetensors(path, {{"a", at::ones({2})}});
  std::ifstream in(victim);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text == "keep");
  CHECK(at::equal(load_safetensors(path).tensors[0].second, at::ones({2})));
  std::remove(path.c_str());
  std::remove(victim.c_str());
}
