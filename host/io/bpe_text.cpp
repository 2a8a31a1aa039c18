// UTF-8 and file helpers the BPE readers and coders share (bpe_text.h).
#include "host/io/bpe_text.h"
#include "host/io/bpe.h"
#include "host/io/digest.h"

#include <algorithm>

#include <unistd.h>

namespace anatomy::io::bpe_text {

std::string read_file(const std::string& path) {
  if (::access(path.c_str(), F_OK) != 0) throw TokenizerError("cannot open '" + path + "'");
  try {
    return io::read_whole_file(path);
  } catch (const std::runtime_error& e) {
    throw TokenizerError(e.what());
  }
}

// Splits UTF-8 text into its characters (as strings); invalid bytes stand alone.
std::vector<std::string> utf8_chars(std::string_view s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
    if (i + n > s.size()) n = 1;
    out.emplace_back(s.substr(i, n));
    i += n;
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

uint32_t decode_utf8(const std::string& c) {
  auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(c[i])); };
  if (c.size() == 1) return b(0);
  if (c.size() == 2) return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
  if (c.size() == 3) return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
  return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
}

// The bytes as UTF-8, each maximal invalid subsequence replaced by U+FFFD
// (the Unicode standard's practice, and Rust's from_utf8_lossy).
std::string valid_utf8(const std::string& s) {
  std::string out;
  auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  for (size_t i = 0; i < s.size();) {
    unsigned char c = byte(i);
    size_t n = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
    if (c < 0x80) n = 1;
    else if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c >= 0xE0 && c <= 0xEF) { n = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    size_t good = n == 0 ? 0 : 1;  // bytes of a valid prefix
    while (good > 0 && good < n && i + good < s.size()) {
      unsigned char b = byte(i + good);
      if (good == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) break;
      ++good;
    }
    if (n > 0 && good == n) {
      out.append(s, i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += std::max<size_t>(good, 1);
    }
  }
  return out;
}

}  // namespace anatomy::io::bpe_text
