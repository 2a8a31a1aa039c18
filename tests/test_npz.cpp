// .npz: archives made here byte by byte (each .npy member's header written
// out, the zip made with libzip, then patched where a test needs a lie) read
// back exactly, and every kind of bad member refused with a message naming
// the file, the member and what is wrong, before anything large is allocated.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "host/io/npz.h"

#include <unistd.h>
#include <zip.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

using anatomy::io::load_npz;
using anatomy::io::NpzError;
using anatomy::io::parse_npy_header;
using anatomy::io::save_npz;

namespace {

std::string temp_path(const std::string& name) { return "/tmp/anatomy_npz_" + std::to_string(getpid()) + "_" + name + ".npz"; }

// A .npy member: magic, version, header length, the dict padded to 64, data.
std::string npy(const std::string& dict, const std::string& data, int major = 1) {
  std::string d = dict;
  size_t prefix = major == 1 ? 10 : 12;
  d.append((64 - (prefix + d.size() + 1) % 64) % 64, ' ');
  d += '\n';
  std::string out = std::string("\x93NUMPY", 6) + static_cast<char>(major) + '\0';
  out += static_cast<char>(d.size() & 0xff);
  out += static_cast<char>((d.size() >> 8) & 0xff);
  if (major > 1) out += std::string(2, '\0');
  return out + d + data;
}

std::string header(const std::string& descr, const std::string& shape, bool fortran = false) {
  return "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") + ", 'shape': " + shape + ", }";
}

template <class T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

struct Member {
  std::string name, bytes;
  bool deflate = false;
};

std::string make_zip(const std::string& name, const std::vector<Member>& members) {
  std::string path = temp_path(name);
  std::remove(path.c_str());
  int err = 0;
  zip_t* z = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &err);
  REQUIRE(z != nullptr);
  for (const Member& m : members) {
    zip_source_t* s = zip_source_buffer(z, m.bytes.data(), m.bytes.size(), 0);
    zip_int64_t i = zip_file_add(z, m.name.c_str(), s, ZIP_FL_ENC_UTF_8);
    REQUIRE(i >= 0);
    zip_set_file_compression(z, static_cast<zip_uint64_t>(i), m.deflate ? ZIP_CM_DEFLATE : ZIP_CM_STORE, 0);
  }
  REQUIRE(zip_close(z) == 0);
  return path;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
void write_file(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

// Replaces every occurrence of `from` by `to` (same length) in the file: a
// member's name in both its local header and the central directory.
void patch(const std::string& path, const std::string& from, const std::string& to) {
  std::string b = read_file(path);
  for (size_t at = b.find(from); at != std::string::npos; at = b.find(from, at + 1)) b.replace(at, from.size(), to);
  write_file(path, b);
}

// Sets the uncompressed size of the (only) member in the local header and
// the central directory.
void patch_size(const std::string& path, uint32_t size) {
  std::string b = read_file(path);
  auto put = [&](size_t at) {
    for (int i = 0; i < 4; ++i) b[at + i] = static_cast<char>((size >> (8 * i)) & 0xff);
  };
  put(b.find(std::string("PK\x03\x04", 4)) + 22);
  put(b.find(std::string("PK\x01\x02", 4)) + 24);
  write_file(path, b);
}

std::string load_error(const std::string& path) {
  try {
    load_npz(path);
  } catch (const NpzError& e) {
    std::remove(path.c_str());
    return e.what();
  }
  std::remove(path.c_str());
  return "(no error)";
}

std::string one_member_error(const std::string& test, const std::string& bytes, const std::string& name = "x.npy") {
  return load_error(make_zip(test, {{name, bytes}}));
}

}  // namespace

TEST_CASE("npz: plain arrays of every dtype read back exactly", "[npz]") {
  std::vector<float> f4 = {0.5f, -1.25f, 3e-8f, 1e30f, -0.0f, 7.0f};
  std::vector<double> f8 = {1.0 / 3, -2.5};
  std::vector<int8_t> i1 = {-128, 127, 0};
  std::vector<int16_t> i2 = {-32768, 32767};
  std::vector<int32_t> i4 = {-2147483647 - 1, 5};
  std::vector<int64_t> i8 = {INT64_MIN, INT64_MAX};
  std::vector<uint8_t> u1 = {0, 255};
  std::vector<uint8_t> b1 = {1, 0, 2};  // a byte other than 0 or 1 is true, as numpy reads it
  std::vector<uint16_t> f2 = {0x3c00, 0xc000};  // 1.0 and -2.0 in half precision
  std::string path = make_zip("dtypes", {
      {"f4.npy", npy(header("<f4", "(2, 3)"), bytes_of(f4))},
      {"f8.npy", npy(header("<f8", "(2,)"), bytes_of(f8)), true},
      {"i1.npy", npy(header("|i1", "(3,)"), bytes_of(i1))},
      {"i2.npy", npy(header("<i2", "(2,)"), bytes_of(i2))},
      {"i4.npy", npy(header("=i4", "(2,)"), bytes_of(i4), 2)},
      {"i8.npy", npy(header("<i8", "(2,)"), bytes_of(i8), 3)},
      {"u1.npy", npy(header("|u1", "(2,)"), bytes_of(u1))},
      {"b1.npy", npy(header("|b1", "(3,)"), bytes_of(b1))},
      {"f2.npy", npy(header("<f2", "(2,)"), bytes_of(f2))},
      {"scalar.npy", npy(header("<f8", "()"), bytes_of(std::vector<double>{2.5}))},
      {"empty.npy", npy(header("<f4", "(0, 3)"), "")},
      {"layer/W.npy", npy(header("<f4", "(1,)"), bytes_of(std::vector<float>{9}))},
  });
  auto arrays = load_npz(path);
  std::remove(path.c_str());
  REQUIRE(arrays.size() == 12);
  CHECK(arrays[0].first == "f4");
  CHECK(arrays[11].first == "layer/W");
  const at::Tensor& a = arrays[0].second;
  CHECK(a.scalar_type() == at::kFloat);
  CHECK(a.sizes() == at::IntArrayRef{2, 3});
  CHECK(std::memcmp(a.data_ptr(), f4.data(), 24) == 0);
  CHECK(arrays[1].second.equal(at::tensor(f8, at::kDouble)));
  CHECK(arrays[2].second.equal(at::tensor({-128, 127, 0}, at::kChar)));
  CHECK(arrays[3].second.equal(at::tensor({-32768, 32767}, at::kShort)));
  CHECK(arrays[4].second.equal(at::tensor({INT32_MIN, 5}, at::kInt)));
  CHECK(arrays[5].second.equal(at::tensor({INT64_MIN, INT64_MAX}, at::kLong)));
  CHECK(arrays[6].second.equal(at::tensor({0, 255}, at::kByte)));
  CHECK(arrays[7].second.equal(at::tensor({1, 0, 1}).to(at::kBool)));
  CHECK(arrays[8].second.equal(at::tensor({1.0, -2.0}).to(at::kHalf)));
  CHECK(arrays[9].second.dim() == 0);
  CHECK(arrays[9].second.item<double>() == 2.5);
  CHECK(arrays[10].second.sizes() == at::IntArrayRef{0, 3});
}

TEST_CASE("npz: Fortran order is transposed and big-endian data swapped", "[npz]") {
  // numpy.asfortranarray(arange(6).reshape(2, 3)) stores 0 3 1 4 2 5
  std::vector<int64_t> column_major = {0, 3, 1, 4, 2, 5};
  std::vector<float> f = {1.5f, -2.0f};
  std::string big;
  for (float x : f) {
    std::string b(reinterpret_cast<const char*>(&x), 4);
    big += std::string(b.rbegin(), b.rend());
  }
  std::vector<int64_t> chw(24);
  for (int i = 0; i < 24; ++i) chw[i] = i;  // Fortran order of a (2, 3, 4) array: the first index fastest
  std::string path = make_zip("fortran", {
      {"F.npy", npy(header("<i8", "(2, 3)", true), bytes_of(column_major))},
      {"big.npy", npy(header(">f4", "(2,)"), big)},
      {"F3.npy", npy(header("<i8", "(2, 3, 4)", true), bytes_of(chw))},
  });
  auto arrays = load_npz(path);
  std::remove(path.c_str());
  CHECK(arrays[0].second.equal(at::arange(6, at::kLong).reshape({2, 3})));
  CHECK(arrays[0].second.is_contiguous());
  CHECK(arrays[1].second.equal(at::tensor({1.5f, -2.0f})));
  at::Tensor f3 = arrays[2].second;
  REQUIRE(f3.sizes() == at::IntArrayRef{2, 3, 4});
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) CHECK(f3[i][j][k].item<int64_t>() == i + 2 * j + 6 * k);
}

TEST_CASE("npz: dtypes that are not plain numbers are refused", "[npz]") {
  std::string e = one_member_error("object", npy(header("|O", "(2,)"), std::string(16, '\0')));
  CHECK_THAT(e, Catch::Contains("member 'x.npy'") && Catch::Contains("object array") && Catch::Contains("pickle"));
  CHECK_THAT(e, Catch::StartsWith("'/tmp/anatomy_npz_"));
  e = one_member_error("structured", npy("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", std::string(4, '\0')));
  CHECK_THAT(e, Catch::Contains("structured array"));
  CHECK_THAT(one_member_error("unicode", npy(header("<U4", "(1,)"), std::string(16, '\0'))), Catch::Contains("a string type"));
  CHECK_THAT(one_member_error("complex", npy(header("<c8", "(1,)"), std::string(8, '\0'))), Catch::Contains("a complex type"));
  CHECK_THAT(one_member_error("u4", npy(header("<u4", "(1,)"), std::string(4, '\0'))), Catch::Contains("no dtype for"));
  CHECK_THAT(one_member_error("void", npy(header("<V2", "(1,)"), std::string(2, '\0'))), Catch::Contains("bfloat16"));
  CHECK_THAT(one_member_error("pipe4", npy(header("|f4", "(1,)"), std::string(4, '\0'))), Catch::Contains("no byte order"));
}

TEST_CASE("npz: headers that are not numpy's are refused", "[npz]") {
  CHECK_THAT(one_member_error("magic", "PK not an array at all, long enough"), Catch::Contains("magic"));
  std::string v4 = npy(header("<f4", "(1,)"), std::string(4, '\0'));
  v4[6] = 4;
  CHECK_THAT(one_member_error("version", v4), Catch::Contains(".npy version 4.0 is unknown"));
  CHECK_THAT(one_member_error("keys", npy("{'descr': '<f4', 'shape': (1,), }", std::string(4, '\0'))),
             Catch::Contains("lacks 'fortran_order'"));
  CHECK_THAT(one_member_error("extra", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", "")),
             Catch::Contains("the key 'x'"));
  CHECK_THAT(one_member_error("expr", npy("{'descr': '<f4', 'fortran_order': __import__('os'), 'shape': (1,)}", "")),
             Catch::Contains("neither True nor False"));
  CHECK_THAT(one_member_error("paren", npy(header("<f4", "(4)"), std::string(16, '\0'))), Catch::Contains("not a tuple"));
  CHECK_THAT(one_member_error("negative", npy(header("<f4", "(-1,)"), "")), Catch::Contains("non-negative"));
  // a header length past the member's end, and past the 64 KiB bound
  std::string long_header = std::string("\x93NUMPY\x02\x00", 8) + std::string("\xff\xff\x01\x00", 4) + "{}";
  CHECK_THAT(one_member_error("huge", long_header), Catch::Contains("more than the 65536 allowed"));
}

TEST_CASE("npz: a shape must account for every data byte, and fit in int64", "[npz]") {
  std::string e = one_member_error("short", npy(header("<f4", "(2, 3)"), std::string(20, '\0')));
  CHECK_THAT(e, Catch::Contains("needs 24 data bytes but the member holds 20"));
  e = one_member_error("long", npy(header("<f4", "(2, 3)"), std::string(28, '\0')));
  CHECK_THAT(e, Catch::Contains("needs 24 data bytes but the member holds 28"));
  e = one_member_error("overflow", npy(header("<f4", "(4611686018427387904, 4)"), ""));
  CHECK_THAT(e, Catch::Contains("more than 2^63 - 1 elements"));
  e = one_member_error("bytes", npy(header("<f8", "(2305843009213693952,)"), ""));
  CHECK_THAT(e, Catch::Contains("more than 2^63 bytes"));
}

TEST_CASE("npz: names: duplicates, path tricks and non-arrays are refused", "[npz]") {
  std::string a = npy(header("<f4", "(1,)"), std::string(4, '\0'));
  std::string path = make_zip("dup", {{"a.npy", a}, {"b.npy", a}});
  patch(path, "b.npy", "a.npy");
  CHECK_THAT(load_error(path), Catch::Contains("two members have the same name"));
  for (const char* bad : {"../a.npy", "/etc/a.npy", "a/../b.npy", "a//b.npy", "./a.npy", "a\\b.npy"}) {
    // libzip may refuse to write some names, so a plain name of the same length is patched in
    std::string plain(std::strlen(bad) - 4, 'q');
    path = make_zip("trick", {{plain + ".npy", a}});
    patch(path, plain + ".npy", bad);
    CHECK_THAT(load_error(path), Catch::Contains("member '" + std::string(bad) + "': the name "));
  }
  CHECK_THAT(one_member_error("txt", "hello", "readme.txt"), Catch::Contains("member 'readme.txt': not a .npy array"));
  CHECK_THAT(one_member_error("bare", a, ".npy"), Catch::Contains("not a .npy array"));
}

TEST_CASE("npz: what is not a zip, or lies about its sizes, is refused", "[npz]") {
  std::string path = temp_path("text");
  write_file(path, "not a zip archive at all");
  CHECK_THAT(load_error(path), Catch::Contains("is not a readable zip archive"));
  CHECK_THAT(load_error("/tmp/anatomy_npz_no_such_file.npz"), Catch::Contains("no_such_file"));
  // truncated: the central directory is gone
  std::string a = npy(header("<f4", "(64,)"), std::string(256, '\1'));
  path = make_zip("cut", {{"a.npy", a, true}});
  std::string b = read_file(path);
  write_file(path, b.substr(0, b.size() / 2));
  CHECK_THAT(load_error(path), Catch::Contains("is not a readable zip archive"));
  // a deflated member declaring more bytes than it inflates to, with a header
  // whose shape matches the lie: the read stops, nothing past the lie is kept
  std::string h4096 = npy(header("<f4", "(4096,)"), "");
  path = make_zip("lie", {{"a.npy", h4096 + std::string(4096, '\0'), true}});
  patch_size(path, static_cast<uint32_t>(h4096.size() + 16384));
  std::string e = load_error(path);
  CHECK_THAT(e, Catch::Contains("member 'a.npy'"));
  CHECK_THAT(e, Catch::Contains("ends early") || Catch::Contains("CRC") || Catch::Contains("nconsistent"));
  // the other way: more bytes than declared
  std::string h1024 = npy(header("<f4", "(1024,)"), "");
  path = make_zip("more", {{"a.npy", h1024 + std::string(8192, '\0'), true}});
  patch_size(path, static_cast<uint32_t>(h1024.size() + 4096));
  e = load_error(path);
  CHECK_THAT(e, Catch::Contains("member 'a.npy'"));
}

TEST_CASE("npz: save_npz writes what load_npz reads, atomically", "[npz]") {
  std::string path = temp_path("save");
  std::vector<std::pair<std::string, at::Tensor>> in = {
      {"W_dec", at::randn({3, 5})},  {"b", at::randn({5}, at::kDouble)}, {"i", at::arange(7, at::kLong)},
      {"h", at::randn({2}).to(at::kHalf)}, {"m", at::tensor({1, 0}).to(at::kBool)}, {"s", at::tensor(3.0)},
      {"t", at::randn({4, 3}).t()},  // not contiguous: written in C order
  };
  for (bool compressed : {false, true}) {
    save_npz(path, in, compressed);
    auto out = load_npz(path);
    REQUIRE(out.size() == in.size());
    for (size_t k = 0; k < in.size(); ++k) {
      CHECK(out[k].first == in[k].first);
      CHECK(out[k].second.scalar_type() == in[k].second.scalar_type());
      CHECK(out[k].second.equal(in[k].second));
    }
  }
  std::string before = read_file(path);
  CHECK_THROWS_WITH(save_npz(path, {{"x", at::randn({2}).to(at::kBFloat16)}}), Catch::Contains("has no numpy dtype"));
  CHECK_THROWS_WITH(save_npz(path, {{"../x", at::randn({2})}}), Catch::Contains("'..' path segment"));
  CHECK(read_file(path) == before);
  CHECK_THROWS_WITH(save_npz("/tmp/anatomy_npz_no_dir/x.npz", in), Catch::Contains("anatomy_npz_no_dir"));
  std::remove(path.c_str());
}

TEST_CASE("npz: parse_npy_header alone", "[npz]") {
  std::string h = npy(header("<f4", "(3, 4)"), "");
  auto parsed = parse_npy_header(h, h.size() + 48, "where");
  CHECK(parsed.header_bytes == h.size());
  CHECK(h.size() % 64 == 0);
  CHECK(parsed.data_bytes == 48);
  CHECK(parsed.shape == std::vector<int64_t>{3, 4});
  CHECK_THROWS_WITH(parse_npy_header(h.substr(0, 30), h.size() + 48, "where"), Catch::StartsWith("where: ") && Catch::Contains("cut off"));
}
