// .npz reading and writing (see npz.h). The .npy format: numpy's
// numpy/lib/format.py documents it (magic "\x93NUMPY", a version byte pair,
// a little-endian header length of 2 bytes in 1.0 and 4 in 2.0 and 3.0, then
// the header: a Python dict literal padded with spaces and ended by '\n').
#include "host/io/npz.h"

#include "host/io/digest.h"
#include "host/io/durable.h"
#include "host/runtime.h"

#include <ATen/ATen.h>
#include <zip.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <memory>
#include <set>

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "npz.cpp reads '<' and '=' data as the host's own byte order");

namespace anatomy::io {
namespace {

const char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLength = 6;
constexpr size_t kMaxDims = 64;

std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

[[noreturn]] void fail(const std::string& where, const std::string& why) { throw NpzError(where + ": " + why); }

// A strict reader of the header's dict literal: string keys, and values that
// are a string, True/False or a tuple of non-negative integers. Anything else
// (a list of fields, an expression) is refused.
struct Literal {
  const std::string& s;
  size_t i;
  const std::string& where;

  void space() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
  }
  bool eat(char c) {
    space();
    if (i < s.size() && s[i] == c) return ++i, true;
    return false;
  }
  [[noreturn]] void bad(const std::string& what) {
    fail(where, "the .npy header " + what + " at character " + std::to_string(i + 1) + " of " + in_quotes(s));
  }
  std::string string() {
    space();
    if (i >= s.size() || (s[i] != '\'' && s[i] != '"')) bad("has no quoted string");
    char q = s[i++];
    size_t start = i;
    while (i < s.size() && s[i] != q) {
      if (s[i] == '\\' || static_cast<unsigned char>(s[i]) < 0x20) bad("has an escape or control character in a string");
      ++i;
    }
    if (i >= s.size()) bad("has an unterminated string");
    return s.substr(start, i++ - start);
  }
  bool boolean() {
    space();
    if (s.compare(i, 4, "True") == 0) return i += 4, true;
    if (s.compare(i, 5, "False") == 0) return i += 5, false;
    bad("has neither True nor False");
  }
  std::vector<int64_t> shape() {
    if (!eat('(')) bad("has a shape that is not a tuple");
    std::vector<int64_t> out;
    while (!eat(')')) {
      space();
      if (i >= s.size() || !std::isdigit(static_cast<unsigned char>(s[i]))) bad("has a shape entry that is not a non-negative integer");
      uint64_t v = 0;
      while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
        if (__builtin_mul_overflow(v, 10u, &v) || __builtin_add_overflow(v, static_cast<unsigned>(s[i] - '0'), &v) ||
            v > static_cast<uint64_t>(INT64_MAX))
          bad("has a shape entry larger than 2^63 - 1");
        ++i;
      }
      out.push_back(static_cast<int64_t>(v));
      if (out.size() > kMaxDims) bad("has more than " + std::to_string(kMaxDims) + " dimensions");
      if (!eat(',')) {
        if (!eat(')')) bad("has a shape tuple without ',' or ')'");
        if (out.size() == 1) bad("has '(n)', which is not a tuple");  // numpy writes (n,)
        break;
      }
    }
    return out;
  }
};

struct Dtype {
  char kind;
  int size;
  c10::ScalarType type;
};
const Dtype kDtypes[] = {
    {'f', 2, at::kHalf}, {'f', 4, at::kFloat}, {'f', 8, at::kDouble}, {'i', 1, at::kChar}, {'i', 2, at::kShort},
    {'i', 4, at::kInt},  {'i', 8, at::kLong},  {'u', 1, at::kByte},   {'b', 1, at::kBool},
};

// descr: an optional byte order ('<' little, '>' big, '=' native, '|' not
// applicable: one-byte types), a kind letter and the item size in bytes.
void read_descr(const std::string& descr, NpyHeader& h, const std::string& where) {
  size_t i = 0;
  char order = '=';
  if (!descr.empty() && std::strchr("<>=|", descr[0])) order = descr[i++];
  if (i >= descr.size()) fail(where, "dtype " + in_quotes(descr) + " has no kind");
  char kind = descr[i++];
  std::string digits = descr.substr(i);
  bool numeric = !digits.empty() && digits.size() <= 2 &&
                 std::all_of(digits.begin(), digits.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
  if (kind == 'O') fail(where, "dtype " + in_quotes(descr) + " is an object array, which numpy stores as a pickle: refused");
  for (const Dtype& d : kDtypes) {
    if (d.kind != kind || !numeric || std::stoi(digits) != d.size) continue;
    if (order == '|' && d.size > 1)
      fail(where, "dtype " + in_quotes(descr) + " gives no byte order for a " + std::to_string(d.size) + "-byte type");
    h.type = d.type;
    h.byte_swap = order == '>' && d.size > 1;
    return;
  }
  const char* what = kind == 'u' ? "an unsigned integer wider than a byte, which LibTorch has no dtype for"
                   : kind == 'c' ? "a complex type"
                   : std::strchr("USa", kind) ? "a string type"
                   : kind == 'V' ? "a raw (void) type; bfloat16 is not a numpy dtype and is written this way"
                   : std::strchr("Mm", kind) ? "a date or time type"
                   : "not a numpy dtype this reader knows";
  fail(where, "dtype " + in_quotes(descr) + " is " + what + " (plain arrays of f2, f4, f8, i1, i2, i4, i8, u1 or b1 are read)");
}

}  // namespace

// The header's total size from its first bytes (magic, version, length).
static uint64_t npy_header_size(const std::string& bytes, uint64_t member_size, const std::string& where) {
  if (member_size < 10 || bytes.size() < 10 || bytes.compare(0, kMagicLength, kMagic, kMagicLength) != 0)
    fail(where, "not a .npy array (it does not start with numpy's magic \\x93NUMPY)");
  int major = static_cast<unsigned char>(bytes[6]), minor = static_cast<unsigned char>(bytes[7]);
  if (minor != 0 || major < 1 || major > 3)
    fail(where, ".npy version " + std::to_string(major) + "." + std::to_string(minor) + " is unknown (1.0, 2.0 and 3.0 are)");
  uint64_t prefix = major == 1 ? 10 : 12;
  if (member_size < prefix || bytes.size() < prefix) fail(where, "the .npy header length is cut off");
  uint64_t n = static_cast<unsigned char>(bytes[8]) | static_cast<uint64_t>(static_cast<unsigned char>(bytes[9])) << 8;
  if (major > 1)
    n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[10])) << 16 |
         static_cast<uint64_t>(static_cast<unsigned char>(bytes[11])) << 24;
  if (n > kMaxNpyHeader)
    fail(where, "the .npy header claims " + std::to_string(n) + " bytes, more than the " + std::to_string(kMaxNpyHeader) +
                    " allowed");
  if (prefix + n > member_size)
    fail(where, "the .npy header claims " + std::to_string(n) + " bytes but the member holds " + std::to_string(member_size));
  return prefix + n;
}

NpyHeader parse_npy_header(const std::string& bytes, uint64_t member_size, const std::string& where) {
  NpyHeader h;
  h.header_bytes = npy_header_size(bytes, member_size, where);
  if (bytes.size() < h.header_bytes) fail(where, "the .npy header is cut off");
  const std::string text = bytes.substr(bytes[6] == 1 ? 10 : 12, h.header_bytes - (bytes[6] == 1 ? 10 : 12));
  Literal lit{text, 0, where};
  if (!lit.eat('{')) lit.bad("is not a dict");
  bool seen_descr = false, seen_order = false, seen_shape = false;
  while (!lit.eat('}')) {
    std::string key = lit.string();
    if (!lit.eat(':')) lit.bad("has no ':' after a key");
    if (key == "descr" && !seen_descr) {
      lit.space();
      if (lit.i < text.size() && text[lit.i] == '[')
        fail(where, "the dtype is a list of fields (a structured array): refused, plain arrays only");
      read_descr(lit.string(), h, where);
      seen_descr = true;
    } else if (key == "fortran_order" && !seen_order) {
      h.fortran_order = lit.boolean();
      seen_order = true;
    } else if (key == "shape" && !seen_shape) {
      h.shape = lit.shape();
      seen_shape = true;
    } else {
      fail(where, "the .npy header has the key " + in_quotes(key) + (key == "descr" || key == "shape" || key == "fortran_order" ? " twice" : "") +
                      " (expected 'descr', 'fortran_order' and 'shape' once each)");
    }
    if (!lit.eat(',')) {
      if (!lit.eat('}')) lit.bad("has no ',' or '}' after a value");
      break;
    }
  }
  lit.space();
  if (lit.i != text.size()) lit.bad("has text after the dict");
  if (!seen_descr || !seen_order || !seen_shape)
    fail(where, std::string("the .npy header lacks '") + (!seen_descr ? "descr" : !seen_order ? "fortran_order" : "shape") + "'");
  uint64_t numel = 1;
  for (int64_t d : h.shape)
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel) || numel > static_cast<uint64_t>(INT64_MAX))
      fail(where, "the shape has more than 2^63 - 1 elements");
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(c10::elementSize(h.type)), &h.data_bytes) ||
      h.data_bytes > static_cast<uint64_t>(INT64_MAX))
    fail(where, "the shape needs more than 2^63 bytes");
  if (h.header_bytes + h.data_bytes != member_size)
    fail(where, "the shape needs " + std::to_string(h.data_bytes) + " data bytes but the member holds " +
                    std::to_string(member_size - h.header_bytes) + " after its header");
  return h;
}

namespace {

// Why a member's name cannot name an array, or "" when it can: names are
// keys, never paths, but one that looks like a path trick is refused anyway.
std::string bad_name(const std::string& name) {
  if (name.empty()) return "is empty";
  if (name[0] == '/') return "is an absolute path";
  for (unsigned char c : name)
    if (c < 0x20 || c == 0x7f || c == '\\') return "holds a backslash or a control character";
  size_t start = 0;
  while (true) {
    size_t end = name.find('/', start);
    std::string seg = name.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (seg.empty() || seg == "." || seg == "..") return "has an empty, '.' or '..' path segment";
    if (end == std::string::npos) return "";
    start = end + 1;
  }
}

struct ZipCloser {
  void operator()(zip_t* z) const { zip_discard(z); }
};
struct FileCloser {
  void operator()(zip_file_t* f) const { zip_fclose(f); }
};

// Reads exactly n bytes; false when the member ends first or libzip fails
// (a CRC or inflate error), with the reason in why.
bool read_exact(zip_file_t* f, void* out, uint64_t n, std::string& why) {
  char* p = static_cast<char*>(out);
  while (n > 0) {
    zip_int64_t got = zip_fread(f, p, std::min<uint64_t>(n, uint64_t(1) << 30));
    if (got < 0) return why = zip_error_strerror(zip_file_get_error(f)), false;
    if (got == 0) return why = "the member ends early", false;
    p += got;
    n -= static_cast<uint64_t>(got);
  }
  return true;
}

void swap_bytes(at::Tensor& t, size_t size) {
  auto* p = static_cast<unsigned char*>(t.data_ptr());
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i, p += size) std::reverse(p, p + size);
}

struct Member {
  zip_uint64_t index;
  std::string name;  // without .npy
  std::string where;
  uint64_t size;
};

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> load_npz(const std::string& path) {
  if (std::string why = not_a_file(path); !why.empty()) throw NpzError(in_quotes(path) + " " + why);
  int code = 0;
  std::unique_ptr<zip_t, ZipCloser> za(zip_open(path.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &code));
  if (!za) {
    zip_error_t err;
    zip_error_init_with_code(&err, code);
    std::string why = zip_error_strerror(&err);
    zip_error_fini(&err);
    if (code == ZIP_ER_EXISTS) why = "two members have the same name; libzip: " + why;
    throw NpzError(in_quotes(path) + " is not a readable zip archive (" + why + ")");
  }
  const std::string file = in_quotes(path);
  // First every member's name, method and declared size, so that nothing is
  // inflated or allocated before the whole archive is known to fit.
  std::vector<Member> members;
  std::set<std::string> names;
  uint64_t total = 0;
  zip_int64_t count = zip_get_num_entries(za.get(), 0);
  for (zip_int64_t i = 0; i < count; ++i) {
    zip_stat_t st;
    zip_stat_init(&st);
    if (zip_stat_index(za.get(), static_cast<zip_uint64_t>(i), 0, &st) != 0 || !(st.valid & ZIP_STAT_NAME))
      fail(file, "member " + std::to_string(i + 1) + " cannot be read (" + zip_strerror(za.get()) + ")");
    const std::string raw = st.name;
    const std::string where = file + ": member " + in_quotes(raw);
    if (std::string why = bad_name(raw); !why.empty()) fail(where, "the name " + why);
    if (raw.size() < 5 || raw.compare(raw.size() - 4, 4, ".npy") != 0) fail(where, "not a .npy array (its name does not end in .npy)");
    std::string name = raw.substr(0, raw.size() - 4);
    if (!names.insert(name).second) fail(where, "the name " + in_quotes(name) + " appears twice in the archive");
    if (!(st.valid & ZIP_STAT_SIZE) || !(st.valid & ZIP_STAT_COMP_METHOD) || !(st.valid & ZIP_STAT_ENCRYPTION_METHOD))
      fail(where, "the archive does not give its size and compression method");
    if (st.encryption_method != ZIP_EM_NONE) fail(where, "it is encrypted");
    if (st.comp_method != ZIP_CM_STORE && st.comp_method != ZIP_CM_DEFLATE)
      fail(where, "compression method " + std::to_string(st.comp_method) + " (stored and deflated members are read, as numpy writes)");
    if (st.comp_method == ZIP_CM_STORE && (st.valid & ZIP_STAT_COMP_SIZE) && st.comp_size != st.size)
      fail(where, "a stored member of " + std::to_string(st.size) + " bytes takes " + std::to_string(st.comp_size) + " in the archive");
    if (__builtin_add_overflow(total, st.size, &total)) fail(file, "the members' sizes add up past 2^64 bytes");
    members.push_back({static_cast<zip_uint64_t>(i), name, where, st.size});
  }
  const uint64_t available = available_memory();
  if (available > 0 && total > available)
    fail(file, "its arrays would take " + std::to_string(total) + " bytes, more than the " + std::to_string(available) +
                   " bytes of memory left");

  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const Member& m : members) {
    std::unique_ptr<zip_file_t, FileCloser> f(zip_fopen_index(za.get(), m.index, 0));
    if (!f) fail(m.where, std::string("cannot be opened (") + zip_strerror(za.get()) + ")");
    std::string why;
    std::string head(std::min<uint64_t>(m.size, 12), '\0');
    if (!read_exact(f.get(), head.data(), head.size(), why)) fail(m.where, why);
    uint64_t header_bytes = npy_header_size(head, m.size, m.where);
    head.resize(header_bytes);
    if (header_bytes > 12 && !read_exact(f.get(), head.data() + 12, header_bytes - 12, why)) fail(m.where, why);
    NpyHeader h = parse_npy_header(head, m.size, m.where);
    // Fortran order: the data is the transpose's C-order data.
    std::vector<int64_t> stored = h.shape;
    if (h.fortran_order) std::reverse(stored.begin(), stored.end());
    const bool is_bool = h.type == at::kBool;  // read as bytes: a byte other than 0 or 1 must not become a bool
    at::Tensor t = at::empty(stored, at::TensorOptions().dtype(is_bool ? at::kByte : h.type));
    if (h.data_bytes > 0 && !read_exact(f.get(), t.data_ptr(), h.data_bytes, why)) fail(m.where, why);
    char extra;
    zip_int64_t more = zip_fread(f.get(), &extra, 1);  // the end: libzip checks the CRC here
    if (more < 0) fail(m.where, zip_error_strerror(zip_file_get_error(f.get())));
    if (more > 0) fail(m.where, "it inflates to more bytes than the " + std::to_string(m.size) + " it declares");
    if (h.byte_swap) swap_bytes(t, c10::elementSize(h.type));
    if (is_bool) t = t.ne(0);
    if (h.fortran_order && t.dim() > 1) {
      std::vector<int64_t> dims(t.dim());
      for (int64_t d = 0; d < t.dim(); ++d) dims[d] = t.dim() - 1 - d;
      t = t.permute(dims).contiguous();
    }
    out.emplace_back(m.name, t);
  }
  return out;
}

namespace {

const char* npy_descr(c10::ScalarType t) {
  switch (t) {
    case at::kHalf: return "<f2";
    case at::kFloat: return "<f4";
    case at::kDouble: return "<f8";
    case at::kChar: return "|i1";
    case at::kShort: return "<i2";
    case at::kInt: return "<i4";
    case at::kLong: return "<i8";
    case at::kByte: return "|u1";
    case at::kBool: return "|b1";
    default: return nullptr;
  }
}

// A version 1.0 header as numpy writes it: the dict, spaces, '\n', the whole
// a multiple of 64 bytes.
std::string npy_header(const at::Tensor& t) {
  std::string shape = "(";
  for (int64_t i = 0; i < t.dim(); ++i) shape += (i ? ", " : "") + std::to_string(t.size(i));
  shape += t.dim() == 1 ? ",)" : ")";
  std::string dict = std::string("{'descr': '") + npy_descr(t.scalar_type()) + "', 'fortran_order': False, 'shape': " + shape + ", }";
  size_t total = 10 + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict += '\n';
  std::string out(kMagic, kMagicLength);
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(dict.size() & 0xff);
  out += static_cast<char>(dict.size() >> 8);
  return out + dict;
}

struct SourceFree {
  void operator()(zip_source_t* s) const { zip_source_free(s); }
};

}  // namespace

void save_npz(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors, bool compressed) {
  const std::string file = in_quotes(path);
  std::vector<std::string> headers;
  std::vector<at::Tensor> data;
  std::set<std::string> seen;
  for (const auto& [name, tensor] : tensors) {
    if (std::string why = bad_name(name); !why.empty()) fail(file, "the name " + in_quotes(name) + " " + why);
    if (!seen.insert(name).second) fail(file, "the name " + in_quotes(name) + " appears twice");
    if (!npy_descr(tensor.scalar_type()))
      fail(file, "tensor " + in_quotes(name) + " is " + c10::toString(tensor.scalar_type()) +
                     ", which has no numpy dtype (float16, float32, float64, int8, int16, int32, int64, uint8 and bool do)");
    data.push_back(tensor.detach().to(at::kCPU).contiguous());
    headers.push_back(npy_header(data.back()));
    if (headers.back().size() > 65535 + 10) fail(file, "tensor " + in_quotes(name) + " has too many dimensions for a .npy 1.0 header");
  }
  zip_error_t err;
  zip_error_init(&err);
  std::unique_ptr<zip_source_t, SourceFree> buffer(zip_source_buffer_create(nullptr, 0, 0, &err));
  if (!buffer) fail(file, zip_error_strerror(&err));
  zip_source_keep(buffer.get());  // kept past zip_close, which writes the archive into it
  zip_t* za = zip_open_from_source(buffer.get(), ZIP_TRUNCATE, &err);
  if (!za) {
    zip_source_free(buffer.get());  // drops the reference zip_open would have taken
    fail(file, zip_error_strerror(&err));
  }
  std::unique_ptr<zip_t, ZipCloser> archive(za);
  for (size_t i = 0; i < data.size(); ++i) {
    zip_buffer_fragment_t parts[2] = {{reinterpret_cast<zip_uint8_t*>(headers[i].data()), headers[i].size()},
                                      {static_cast<zip_uint8_t*>(data[i].data_ptr()), data[i].nbytes()}};
    zip_source_t* src = zip_source_buffer_fragment_create(parts, data[i].nbytes() > 0 ? 2 : 1, 0, &err);
    if (!src) fail(file, zip_error_strerror(&err));
    zip_int64_t idx = zip_file_add(za, (tensors[i].first + ".npy").c_str(), src, ZIP_FL_ENC_UTF_8);
    if (idx < 0) {
      zip_source_free(src);
      fail(file, "tensor " + in_quotes(tensors[i].first) + ": " + zip_strerror(za));
    }
    if (zip_set_file_compression(za, static_cast<zip_uint64_t>(idx), compressed ? ZIP_CM_DEFLATE : ZIP_CM_STORE, 0) != 0)
      fail(file, zip_strerror(za));
  }
  if (zip_close(za) != 0) fail(file, zip_strerror(za));
  archive.release();  // closed: zip_close freed it
  if (zip_source_open(buffer.get()) != 0) fail(file, zip_error_strerror(zip_source_error(buffer.get())));
  try {
    write_atomic(path, [&](Sink& sink) {
      std::vector<char> chunk(1 << 20);
      bool half = false;
      while (true) {
        zip_int64_t n = zip_source_read(buffer.get(), chunk.data(), chunk.size());
        if (n < 0) throw WriteError(file + ": " + zip_error_strerror(zip_source_error(buffer.get())));
        if (n == 0) break;
        sink.write(chunk.data(), static_cast<size_t>(n));
        if (!half) pause_mid_write(), half = true;  // a test's kill lands here: the file is part written
      }
    });
  } catch (const WriteError& e) {
    zip_source_close(buffer.get());
    throw NpzError(e.what());
  }
  zip_source_close(buffer.get());
}

}  // namespace anatomy::io
