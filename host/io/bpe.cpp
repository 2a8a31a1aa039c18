// BPE encoding and decoding (see bpe.h); reading the files is bpe_json.cpp's.
#include "host/io/bpe.h"
#include "host/io/bpe_text.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

namespace anatomy::io {

using bpe_text::kSpace;
using bpe_text::append_utf8;
using bpe_text::decode_utf8;
using bpe_text::utf8_chars;
using bpe_text::valid_utf8;

namespace {

// GPT-2's reversible map of the 256 bytes onto printable characters: the
// printable Latin-1 bytes stand for themselves, the others for U+0100 onwards.
struct ByteMap {
  std::string to_char[256];                      // byte -> UTF-8 of its character
  std::unordered_map<uint32_t, uint8_t> to_byte;  // character -> byte
  ByteMap() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      append_utf8(to_char[b], cp);
      to_byte[cp] = static_cast<uint8_t>(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

}  // namespace

// The pre-tokenizer's pattern. Every PCRE2 failure is a TokenizerError naming
// the pattern and PCRE2's message: a match that runs into the match, depth or
// heap limit must not pass for "no more matches" (the text's tail would become
// one piece, and encode would give other ids than tokenizers, which raises).
struct BpeTokenizer::Regex {
  pcre2_code* code = nullptr;
  pcre2_match_data* match = nullptr;
  std::string pattern, where;
  explicit Regex(const std::string& pattern_, const std::string& where_) : pattern(pattern_), where(where_) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &err,
                         &offset, nullptr);
    if (!code)
      throw TokenizerError("'" + where + "': the split pattern '" + pattern + "' does not compile at offset " +
                           std::to_string(offset) + ": " + message(err));
    match = pcre2_match_data_create_from_pattern(code, nullptr);
    if (!match) {
      pcre2_code_free(code);
      throw TokenizerError("'" + where + "': no memory for the matches of the split pattern '" + pattern + "'");
    }
  }
  ~Regex() {
    pcre2_match_data_free(match);
    pcre2_code_free(code);
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  static std::string message(int err) {
    PCRE2_UCHAR msg[256];
    if (pcre2_get_error_message(err, msg, sizeof msg) < 0) return "PCRE2 error " + std::to_string(err);
    return reinterpret_cast<char*>(msg);
  }
  // The pieces of text: every match, and every stretch between matches
  // (tokenizers' Split with behavior "Isolated").
  std::vector<std::string_view> split(std::string_view text) const {
    std::vector<std::string_view> out;
    size_t start = 0, last = 0;
    while (start <= text.size()) {
      int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start,
                           PCRE2_NO_UTF_CHECK, match, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc <= 0)  // 0: the match data too small for the pattern's groups (not with create_from_pattern)
        throw TokenizerError("'" + where + "': the split pattern '" + pattern + "' failed searching from byte " +
                             std::to_string(start) + " of a " + std::to_string(text.size()) + "-byte text: " +
                             (rc < 0 ? message(rc) : "too many capture groups"));
      PCRE2_SIZE* v = pcre2_get_ovector_pointer(match);
      size_t b = v[0], e = v[1];
      if (b > last) out.push_back(text.substr(last, b - last));
      if (e > b) out.push_back(text.substr(b, e - b));
      last = e;
      if (e == b) {  // an empty match: step over one character
        if (e >= text.size()) break;
        start = e + 1;
        while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) ++start;
      } else {
        start = e;
      }
    }
    if (last < text.size()) out.push_back(text.substr(last));
    return out;
  }
};

namespace {
class CorpusBpe : public Tokenizer {
 public:
  explicit CorpusBpe(std::shared_ptr<const BpeTokenizer> t) : t_(std::move(t)) {}
  std::string kind() const override { return "bpe"; }
  int64_t vocab_size() const override { return t_->vocab_size(); }
  std::vector<int64_t> encode(std::string_view text) const override { return t_->encode(text, false); }
  std::string decode(const std::vector<int64_t>& ids) const override { return t_->decode(ids, false); }

 private:
  std::shared_ptr<const BpeTokenizer> t_;
};
}  // namespace

std::unique_ptr<Tokenizer> BpeTokenizer::for_corpus(std::shared_ptr<const BpeTokenizer> tokenizer) {
  return std::make_unique<CorpusBpe>(std::move(tokenizer));
}

BpeTokenizer::BpeTokenizer() = default;
BpeTokenizer::~BpeTokenizer() = default;

void BpeTokenizer::set_split(const std::string& pattern, const std::string& where) { split_ = std::make_unique<Regex>(pattern, where); }

int64_t BpeTokenizer::vocab_size() const { return static_cast<int64_t>(id_to_token_.size()); }

// One pre-token, as symbols: byte-level, its bytes as characters; otherwise
// its characters, one outside the vocabulary spelled as its bytes' <0xNN>
// tokens (byte_fallback) or unknown. Then merged pair by pair, lowest rank first.
void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int64_t>& out) const {
  std::string key(piece);
  if (auto it = cache_.find(key); it != cache_.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  static const std::string kUnknown("\0unk", 4);  // never a token nor half of a merge
  std::vector<std::string> symbols;
  if (byte_level_) {
    const ByteMap& map = byte_map();
    for (unsigned char b : piece) symbols.push_back(map.to_char[b]);
  } else {
    // An unknown character waits until the next known one (or the end), so
    // byte-fallback tokens between overtake it: tokenizers' order, kept.
    bool unknown_waits = false;
    for (auto& c : utf8_chars(piece)) {
      if (vocab_.count(c)) {
        if (unknown_waits) symbols.push_back(kUnknown);
        unknown_waits = false;
        symbols.push_back(std::move(c));
        continue;
      }
      std::vector<std::string> bytes;
      if (byte_fallback_) {
        for (unsigned char b : c) {
          char name[8];
          std::snprintf(name, sizeof name, "<0x%02X>", b);
          if (!vocab_.count(name)) {
            bytes.clear();
            break;
          }
          bytes.emplace_back(name);
        }
      }
      if (!bytes.empty()) {
        symbols.insert(symbols.end(), bytes.begin(), bytes.end());
      } else {
        if (unknown_waits && !fuse_unk_) symbols.push_back(kUnknown);
        unknown_waits = true;
      }
    }
    if (unknown_waits) symbols.push_back(kUnknown);
  }
  std::string whole;
  for (const auto& sym : symbols) whole += sym;
  std::vector<int64_t> ids;
  auto direct = vocab_.find(whole);
  if (ignore_merges_ && direct != vocab_.end()) {
    ids.push_back(direct->second + 1);
  } else {
    while (symbols.size() > 1) {
      int best = INT_MAX;
      size_t at = 0;
      for (size_t i = 0; i + 1 < symbols.size(); ++i) {
        auto it = merge_rank_.find(symbols[i] + " " + symbols[i + 1]);
        if (it != merge_rank_.end() && it->second < best) {
          best = it->second;
          at = i;
        }
      }
      if (best == INT_MAX) break;
      // merge every occurrence of this pair, left to right
      std::string a = symbols[at], b = symbols[at + 1];
      std::vector<std::string> merged;
      for (size_t i = 0; i < symbols.size();) {
        if (i + 1 < symbols.size() && symbols[i] == a && symbols[i + 1] == b) {
          merged.push_back(a + b);
          i += 2;
        } else {
          merged.push_back(symbols[i++]);
        }
      }
      symbols.swap(merged);
    }
    for (const auto& sym : symbols) {
      auto it = sym == kUnknown ? vocab_.end() : vocab_.find(sym);
      if (it != vocab_.end()) ids.push_back(it->second + 1);
      else if (unk_) ids.push_back(*unk_ + 1);
      else if (!byte_level_) continue;  // tokenizers drops it where there is no unk_token
      else throw std::invalid_argument("the piece '" + (sym == kUnknown ? std::string(piece) : sym) +
                                       "' is not in the vocabulary and the tokenizer has no unk_token");
    }
  }
  if (cache_.size() < 100000) cache_.emplace(std::move(key), ids);
  out.insert(out.end(), ids.begin(), ids.end());
}

// Text without added tokens: normalize, pre-tokenize, then BPE each piece.
void BpeTokenizer::encode_plain(std::string_view text, bool first, std::vector<int64_t>& out) const {
  if (text.empty()) return;
  std::string owned;
  if (nfc_) {  // Unicode's canonical composition (utf8proc), as the NFC normalizer does
    utf8proc_uint8_t* composed = nullptr;
    utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                      static_cast<utf8proc_ssize_t>(text.size()), &composed,
                                      static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    if (n < 0) throw std::invalid_argument(std::string("the text is not valid UTF-8 (") + utf8proc_errmsg(n) + ")");
    owned.assign(reinterpret_cast<char*>(composed), static_cast<size_t>(n));
    std::free(composed);
    text = owned;
  }
  if (!byte_level_) {  // SentencePiece-style: spaces become the replacement, which may start the text
    std::string s;
    for (char c : text) {
      if (c == ' ') s += space_;
      else s += c;
    }
    bool starts = s.compare(0, space_.size(), space_) == 0;
    if ((prepend_ == Prepend::always || (prepend_ == Prepend::first && first)) && !(prepend_if_missing_ && starts))
      s = space_ + s;
    if (!split_at_space_) {
      encode_piece(s, out);
      return;
    }
    // Metaspace's split: a piece starts at each replacement (merged with what follows)
    size_t from = 0;
    for (size_t at = s.find(space_, 1); at != std::string::npos; at = s.find(space_, at + 1)) {
      encode_piece(std::string_view(s).substr(from, at - from), out);
      from = at;
    }
    encode_piece(std::string_view(s).substr(from), out);
    return;
  }
  if (add_prefix_space_ && text[0] != ' ') {
    owned = " " + std::string(text);
    text = owned;
  }
  if (!split_) {
    encode_piece(text, out);
    return;
  }
  for (std::string_view piece : split_->split(text)) encode_piece(piece, out);
}

std::vector<int64_t> BpeTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int64_t> out;
  if (add_special_tokens) out = prefix_;
  // Added tokens are found first, longest first at each position; the text
  // between them is encoded as plain text (lstrip/rstrip take the spaces beside).
  size_t start = 0, i = 0;
  while (i < text.size()) {
    const AddedToken* hit = nullptr;
    for (const auto& a : added_)
      if (!a.content.empty() && text.compare(i, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    if (!hit) {
      ++i;
      continue;
    }
    size_t end_plain = i, next = i + hit->content.size();
    if (hit->lstrip)
      while (end_plain > start && std::isspace(static_cast<unsigned char>(text[end_plain - 1]))) --end_plain;
    if (hit->rstrip)
      while (next < text.size() && std::isspace(static_cast<unsigned char>(text[next]))) ++next;
    encode_plain(text.substr(start, end_plain - start), start == 0, out);
    out.push_back(hit->id + 1);
    start = i = next;
  }
  encode_plain(text.substr(start), start == 0, out);
  if (add_special_tokens) out.insert(out.end(), suffix_.begin(), suffix_.end());
  return out;
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  // As tokenizers' ByteLevel decoder: a token whose characters all stand for
  // bytes becomes those bytes, any other token its own text; the bytes are
  // then read as UTF-8, each invalid sequence becoming U+FFFD.
  const ByteMap& map = byte_map();
  std::string bytes;
  std::vector<std::string> tokens;  // SentencePiece-style: through the decoder chain
  for (int64_t id : ids) {
    if (id < 1 || id > vocab_size())
      throw std::out_of_range("token id " + std::to_string(id) + " is out of range 1.." + std::to_string(vocab_size()));
    if (id_to_token_[static_cast<size_t>(id - 1)].empty())
      throw std::out_of_range("token id " + std::to_string(id) + " has no token (the vocabulary skips it)");
    size_t k = static_cast<size_t>(id - 1);
    if (skip_special_tokens && special_[k]) continue;
    if (!byte_level_) {
      tokens.push_back(id_to_token_[k]);
      continue;
    }
    const std::string& token = id_to_token_[k];
    std::string as_bytes;
    bool all = true;
    for (const auto& c : utf8_chars(token)) {
      auto it = map.to_byte.find(decode_utf8(c));
      if (it == map.to_byte.end()) {
        all = false;
        break;
      }
      as_bytes += static_cast<char>(it->second);
    }
    bytes += all ? as_bytes : token;
  }
  return byte_level_ ? valid_utf8(bytes) : decode_chain(tokens);
}

// tokenizers' decoders, step by step over the list of token strings.
std::string BpeTokenizer::decode_chain(const std::vector<std::string>& input) const {
  using Kind = DecodeStep::Kind;
  std::vector<std::string> tokens = input;
  auto byte_token = [](const std::string& t, unsigned char& b) {  // "<0xNN>"
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>' || !std::isxdigit(static_cast<unsigned char>(t[3])) ||
        !std::isxdigit(static_cast<unsigned char>(t[4])))
      return false;
    b = static_cast<unsigned char>(std::strtoul(t.substr(3, 2).c_str(), nullptr, 16));
    return true;
  };
  for (const auto& step : decoder_) {
    std::vector<std::string> next;
    switch (step.kind) {
      case Kind::replace:
        for (auto& t : tokens) {
          std::string r;
          for (size_t i = 0; i < t.size();) {
            if (!step.from.empty() && t.compare(i, step.from.size(), step.from) == 0) {
              r += step.to;
              i += step.from.size();
            } else {
              r += t[i++];
            }
          }
          next.push_back(std::move(r));
        }
        break;
      case Kind::byte_fallback: {  // a run of <0xNN> tokens: its bytes if UTF-8, else one U+FFFD a token
        std::string run;
        size_t count = 0;
        auto flush = [&] {
          if (count == 0) return;
          if (valid_utf8(run) == run) next.push_back(run);
          else for (size_t i = 0; i < count; ++i) next.emplace_back("\xEF\xBF\xBD");
          run.clear();
          count = 0;
        };
        for (auto& t : tokens) {
          unsigned char b = 0;
          if (byte_token(t, b)) {
            run += static_cast<char>(b);
            ++count;
          } else {
            flush();
            next.push_back(std::move(t));
          }
        }
        flush();
        break;
      }
      case Kind::fuse: {
        std::string all;
        for (const auto& t : tokens) all += t;
        next.push_back(std::move(all));
        break;
      }
      case Kind::strip:  // up to `start` copies of the character at the front, `stop` at the back
        for (auto& t : tokens) {
          size_t b = 0, e = t.size();
          for (int i = 0; i < step.start && t.compare(b, step.from.size(), step.from) == 0; ++i) b += step.from.size();
          for (int i = 0; i < step.stop && e >= b + step.from.size() && t.compare(e - step.from.size(), step.from.size(), step.from) == 0; ++i)
            e -= step.from.size();
          next.push_back(t.substr(b, e - b));
        }
        break;
      case Kind::metaspace:  // the replacement is a space again; in the first token it is dropped
        for (size_t k = 0; k < tokens.size(); ++k) {
          std::string r;
          const std::string& t = tokens[k];
          for (size_t i = 0; i < t.size();) {
            if (t.compare(i, step.from.size(), step.from) == 0) {
              if (!(k == 0 && step.start)) r += ' ';
              i += step.from.size();
            } else {
              r += t[i++];
            }
          }
          next.push_back(std::move(r));
        }
        break;
    }
    tokens.swap(next);
  }
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

std::optional<std::string> BpeTokenizer::id_to_token(int64_t id) const {
  if (id < 1 || id > vocab_size() || id_to_token_[static_cast<size_t>(id - 1)].empty()) return std::nullopt;
  return id_to_token_[static_cast<size_t>(id - 1)];
}

std::optional<int64_t> BpeTokenizer::token_to_id(const std::string& token) const {
  if (auto it = vocab_.find(token); it != vocab_.end()) return it->second + 1;
  for (const auto& a : added_)
    if (a.content == token) return a.id + 1;
  return std::nullopt;
}

}  // namespace anatomy::io
