// Byte-level BPE (see bpe.h).
#include "host/io/bpe.h"
#include "host/io/bpe_text.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>
#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

#include <fstream>
#include <sstream>

#include <unistd.h>

#include "host/io/digest.h"

namespace anatomy::io {
namespace bpe_text {

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

}  // namespace bpe_text

using bpe_text::kSpace;
using bpe_text::read_file;
using bpe_text::utf8_chars;

namespace {

using json = nlohmann::json;

// GPT-2's split pattern: the one ByteLevel uses when use_regex is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";


// nlohmann's message without its "[json.exception.type_error.302] " prefix.
std::string json_message(const json::exception& e) {
  std::string what = e.what();
  if (auto close = what.find("] "); what.rfind("[json.exception", 0) == 0 && close != std::string::npos) what = what.substr(close + 2);
  return what;
}

json parse_json(const std::string& path) {
  try {
    return json::parse(read_file(path));
  } catch (const json::exception& e) {
    throw TokenizerError("'" + path + "' is not valid JSON: " + json_message(e));
  }
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

// A token id from the file: an integer from 0 up to a bound that keeps the
// id -> token table the size of the vocabulary (ids are dense in every
// tokenizer.json; a stray 10^18 would ask for an exabyte).
int64_t token_id(const json& v, const std::string& where, size_t entries) {
  const int64_t bound = static_cast<int64_t>(2 * entries) + (1 << 16);
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(bound)))
    throw TokenizerError(where + ": the id " + v.dump() + " is not an integer in 0.." + std::to_string(bound - 1));
  int64_t id = v.get<int64_t>();
  if (id < 0 || id >= bound) throw TokenizerError(where + ": the id " + v.dump() + " is not an integer in 0.." + std::to_string(bound - 1));
  return id;
}

bool flag(const json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? fallback : it->get<bool>();
}

}  // namespace

struct BpeTokenizer::Regex {
  pcre2_code* code = nullptr;
  pcre2_match_data* match = nullptr;
  explicit Regex(const std::string& pattern, const std::string& where) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &err,
                         &offset, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw TokenizerError(where + ": the split pattern does not compile at offset " + std::to_string(offset) + ": " +
                           reinterpret_cast<char*>(msg));
    }
    match = pcre2_match_data_create_from_pattern(code, nullptr);
  }
  ~Regex() {
    pcre2_match_data_free(match);
    pcre2_code_free(code);
  }
  // The pieces of text: every match, and every stretch between matches
  // (tokenizers' Split with behavior "Isolated").
  std::vector<std::string_view> split(std::string_view text) const {
    std::vector<std::string_view> out;
    size_t start = 0, last = 0;
    while (start <= text.size()) {
      int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start,
                           PCRE2_NO_UTF_CHECK, match, nullptr);
      if (rc < 0) break;
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

std::unique_ptr<BpeTokenizer> BpeTokenizer::read_tokenizer_json(const std::string& path) {
  json j = parse_json(path);
  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer());
  auto where = [&](const std::string& key) { return "'" + path + "': " + key; };
  // Metaspace's prepend_scheme (tokenizers >= 0.14), or its older add_prefix_space.
  auto metaspace_prepend = [&](const json& p, const std::string& key) {
    if (p.contains("prepend_scheme") && !p["prepend_scheme"].is_null()) {
      std::string v = p["prepend_scheme"].get<std::string>();
      if (v == "first") return Prepend::first;
      if (v == "always") return Prepend::always;
      if (v == "never") return Prepend::never;
      throw TokenizerError(key + " is '" + v + "'; expected first, always or never");
    }
    return flag(p, "add_prefix_space", true) ? Prepend::always : Prepend::never;
  };
  if (!j.contains("model") || !j["model"].is_object()) throw TokenizerError(where("model") + " is missing");
  const json& model = j["model"];
  std::string type = model.value("type", "BPE");
  if (type != "BPE") throw TokenizerError(where("model.type") + " is '" + type + "'; only BPE is supported");
  if (!model.value("dropout", json()).is_null()) throw TokenizerError(where("model.dropout") + " is set; BPE dropout is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(key) && !model[key].is_null() && model[key] != "")
      throw TokenizerError(where(std::string("model.") + key) + " is set; not supported");
  t->byte_fallback_ = flag(model, "byte_fallback", false);
  t->fuse_unk_ = flag(model, "fuse_unk", false);
  // The normalizer: NFC (Qwen2), or SentencePiece's Prepend("▁") and
  // Replace(" " -> "▁") (Llama 2), alone or in a Sequence.
  const json& norm = j.value("normalizer", json());
  auto normalizer = [&](const json& n) {
    std::string kind = n.value("type", "?");
    if (kind == "NFC") {
      t->nfc_ = true;
    } else if (kind == "Prepend") {
      t->prepend_ = Prepend::always;  // each segment between added tokens, as tokenizers normalizes each
      t->space_ = n.value("prepend", "");
    } else if (kind == "Replace" && n.contains("pattern") && n["pattern"].contains("String") && n["pattern"]["String"] == " ") {
      t->space_ = n.value("content", "");
    } else {
      throw TokenizerError(where("normalizer") + " is '" + kind +
                           "'; supported: NFC, Prepend and Replace(' ' -> '\u2581'), alone or in a Sequence");
    }
  };
  if (!norm.is_null() && norm.value("type", "") == "Sequence") {
    for (const auto& n : norm.value("normalizers", json::array())) normalizer(n);
  } else if (!norm.is_null()) {
    normalizer(norm);
  }
  if (t->prepend_ == Prepend::always && t->space_.empty())
    throw TokenizerError(where("normalizer") + ": a Prepend without a Replace of spaces by the same character is not supported");

  if (!model.contains("vocab") || !model["vocab"].is_object()) throw TokenizerError(where("model.vocab") + " must be an object of token -> id");
  if (!model.contains("merges") || !model["merges"].is_array()) throw TokenizerError(where("model.merges") + " must be a list");
  const size_t entries = model["vocab"].size() + j.value("added_tokens", json::array()).size();
  for (const auto& [token, id] : model.at("vocab").items()) t->vocab_[token] = token_id(id, where("model.vocab '" + token + "'"), entries);
  int rank = 0;
  for (const auto& m : model.at("merges")) {
    std::string key = m.is_string() ? m.get<std::string>() : m.at(0).get<std::string>() + " " + m.at(1).get<std::string>();
    t->merge_rank_.emplace(key, rank++);
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    auto it = t->vocab_.find(model["unk_token"].get<std::string>());
    if (it != t->vocab_.end()) t->unk_ = it->second;
  }
  t->ignore_merges_ = flag(model, "ignore_merges", false);

  // The pre-tokenizer: ByteLevel alone (GPT-2's pattern), or a Split pattern
  // followed by ByteLevel without its own pattern (Llama 3, Qwen2); Metaspace,
  // or none after the Prepend + Replace normalizers (SentencePiece-style).
  const json& pre = j.value("pre_tokenizer", json());
  auto byte_level = [&](const json& p, bool alone) {
    t->add_prefix_space_ = flag(p, "add_prefix_space", false);
    if (flag(p, "use_regex", true)) {
      if (!alone) throw TokenizerError(where("pre_tokenizer") + ": a Split before a ByteLevel with use_regex is not supported");
      t->split_ = std::make_unique<Regex>(kGpt2Pattern, path);
    }
  };
  auto split = [&](const json& p) {
    std::string behavior = p.value("behavior", "Isolated");
    if (behavior != "Isolated") throw TokenizerError(where("pre_tokenizer Split.behavior") + " is '" + behavior + "'; only Isolated is supported");
    if (flag(p, "invert", false)) throw TokenizerError(where("pre_tokenizer Split.invert") + " is true; not supported");
    const json& pattern = p.at("pattern");
    if (!pattern.contains("Regex")) throw TokenizerError(where("pre_tokenizer Split.pattern") + ": only Regex patterns are supported");
    t->split_ = std::make_unique<Regex>(pattern["Regex"].get<std::string>(), path);
  };
  std::string pre_type = pre.is_null() ? "none" : pre.value("type", "?");
  if (pre_type == "ByteLevel") {
    byte_level(pre, true);
  } else if (pre_type == "Sequence" && pre.contains("pretokenizers") && pre["pretokenizers"].size() == 2 &&
             pre["pretokenizers"][0].value("type", "") == "Split" && pre["pretokenizers"][1].value("type", "") == "ByteLevel") {
    split(pre["pretokenizers"][0]);
    byte_level(pre["pretokenizers"][1], false);
  } else if (pre_type == "Metaspace") {
    if (!t->space_.empty()) throw TokenizerError(where("pre_tokenizer") + ": a Metaspace after a normalizer that already replaces spaces is not supported");
    t->byte_level_ = false;
    t->space_ = pre.value("replacement", std::string(kSpace));
    t->prepend_ = metaspace_prepend(pre, where("pre_tokenizer Metaspace.prepend_scheme"));
    t->prepend_if_missing_ = true;
    t->split_at_space_ = flag(pre, "split", true);
  } else if (pre_type == "none" && !t->space_.empty()) {
    t->byte_level_ = false;  // the normalizers did the work (Llama 2's tokenizer.json)
  } else {
    throw TokenizerError(where("pre_tokenizer") + " is '" + pre_type +
                         "'; supported: ByteLevel, a Sequence of Split and ByteLevel, Metaspace, or none after the "
                         "Prepend and Replace normalizers");
  }
  if (t->byte_level_ && (t->byte_fallback_ || !t->space_.empty()))
    throw TokenizerError(where(t->byte_fallback_ ? "model.byte_fallback" : "normalizer") +
                         ": SentencePiece-style settings with a ByteLevel pre-tokenizer are not supported");
  if (t->byte_level_ && t->prepend_ != Prepend::never)
    throw TokenizerError(where("normalizer") + ": Prepend with a ByteLevel pre-tokenizer is not supported");
  // The decoder: ByteLevel for byte-level BPE; for SentencePiece-style, a
  // chain of Replace, ByteFallback, Fuse, Strip, or a Metaspace.
  const json& dec = j.value("decoder", json());
  if (t->byte_level_) {
    if (!dec.is_null() && dec.value("type", "") != "ByteLevel")
      throw TokenizerError(where("decoder") + " is '" + dec.value("type", "?") + "'; only ByteLevel is supported with byte-level BPE");
  } else {
    using Kind = DecodeStep::Kind;
    auto step = [&](const json& d) {
      std::string kind = d.value("type", "?");
      DecodeStep s{Kind::fuse, "", "", 0, 0};
      if (kind == "Replace" && d.contains("pattern") && d["pattern"].contains("String")) {
        s = {Kind::replace, d["pattern"]["String"].get<std::string>(), d.value("content", ""), 0, 0};
      } else if (kind == "ByteFallback") {
        s.kind = Kind::byte_fallback;
      } else if (kind == "Fuse") {
        s.kind = Kind::fuse;
      } else if (kind == "Strip") {
        auto count = [&](const char* key) {  // how many characters Strip takes at one end: a small integer
          auto it = d.find(key);
          if (it == d.end() || it->is_null()) return 0;
          if (!it->is_number_integer() || (it->is_number_unsigned() && it->get<uint64_t>() > 1000) ||
              it->get<int64_t>() < 0 || it->get<int64_t>() > 1000)
            throw TokenizerError(where(std::string("decoder Strip.") + key) + " must be an integer in 0..1000, got " + it->dump());
          return static_cast<int>(it->get<int64_t>());
        };
        s = {Kind::strip, d.value("content", " "), "", count("start"), count("stop")};
        if (utf8_chars(s.from).size() != 1) throw TokenizerError(where("decoder Strip.content") + " must be one character");
      } else if (kind == "Metaspace") {
        s = {Kind::metaspace, d.value("replacement", std::string(kSpace)), "", 0, 0};
        s.start = metaspace_prepend(d, where("decoder Metaspace.prepend_scheme")) != Prepend::never;
      } else {
        throw TokenizerError(where("decoder") + " has '" + kind + "'; supported with SentencePiece-style BPE: Replace, "
                             "ByteFallback, Fuse, Strip, Metaspace");
      }
      t->decoder_.push_back(s);
    };
    if (dec.is_null()) throw TokenizerError(where("decoder") + " is missing; a SentencePiece-style BPE needs one");
    if (dec.value("type", "") == "Sequence") {
      for (const auto& d : dec.value("decoders", json::array())) step(d);
    } else {
      step(dec);
    }
  }

  for (const auto& a : j.value("added_tokens", json::array())) {
    if (flag(a, "single_word", false))
      throw TokenizerError(where("added_tokens") + ": '" + a.value("content", "") + "' has single_word; not supported");
    t->added_.push_back({a.at("content").get<std::string>(), token_id(a.at("id"), where("added_tokens"), entries), flag(a, "special", false),
                         flag(a, "lstrip", false), flag(a, "rstrip", false)});
  }

  // The post-processor: ByteLevel (nothing to add), or a template of special
  // tokens around the text.
  const json& post = j.value("post_processor", json());
  auto add_template = [&](const json& tp) {
    bool before = true;
    for (const auto& piece : tp.at("single")) {
      if (piece.contains("Sequence")) {
        before = false;
        continue;
      }
      std::string name = piece.at("SpecialToken").at("id").get<std::string>();
      const json& ids = tp.at("special_tokens").at(name).at("ids");
      for (const auto& id : ids) (before ? t->prefix_ : t->suffix_).push_back(token_id(id, where("post_processor"), entries) + 1);
    }
  };
  std::string post_type = post.is_null() ? "none" : post.value("type", "?");
  if (post_type == "TemplateProcessing") {
    add_template(post);
  } else if (post_type == "Sequence") {
    for (const auto& p : post.at("processors")) {
      std::string pt = p.value("type", "?");
      if (pt == "TemplateProcessing") add_template(p);
      else if (pt != "ByteLevel") throw TokenizerError(where("post_processor") + " has '" + pt + "'; supported: ByteLevel, TemplateProcessing");
    }
  } else if (post_type != "none" && post_type != "ByteLevel") {
    throw TokenizerError(where("post_processor") + " is '" + post_type + "'; supported: ByteLevel, TemplateProcessing");
  }
  t->finish_loading(path);
  return t;
}


std::unique_ptr<BpeTokenizer> BpeTokenizer::read_vocab_merges(const std::string& vocab_json, const std::string& merges_txt) {
  json v = parse_json(vocab_json);
  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer());
  if (!v.is_object()) throw TokenizerError("'" + vocab_json + "' is not an object of token -> id");
  for (const auto& [token, id] : v.items()) t->vocab_[token] = token_id(id, "'" + vocab_json + "': token '" + token + "'", v.size());
  std::istringstream merges(read_file(merges_txt));
  std::string line;
  int rank = 0;
  while (std::getline(merges, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    if (line.find(' ') == std::string::npos) throw TokenizerError("'" + merges_txt + "': line '" + line + "' is not a merge (two tokens)");
    t->merge_rank_.emplace(line, rank++);
  }
  t->split_ = std::make_unique<Regex>(kGpt2Pattern, vocab_json);
  t->read_added_tokens(vocab_json);
  t->finish_loading(vocab_json);
  return t;
}

// The added and special tokens of a vocab.json + merges.txt folder, as
// transformers' slow tokenizers save them beside it: tokenizer_config.json's
// added_tokens_decoder ({"50257": {"content", "special", "lstrip", "rstrip",
// ...}}), added_tokens.json ({"<|pad|>": 50257}, the older form) and
// special_tokens_map.json (which of them are special: bos_token, eos_token,
// ...). Each is matched in the text before BPE,
// as one token; GPT-2's <|endoftext|> (in vocab.json) is special without them.
void BpeTokenizer::read_added_tokens(const std::string& vocab_json) {
  size_t slash = vocab_json.find_last_of('/');
  std::string folder = slash == std::string::npos ? "." : vocab_json.substr(0, slash);
  auto optional_json = [&](const std::string& name) -> json {
    std::string path = folder + "/" + name;
    if (::access(path.c_str(), F_OK) != 0) return json();
    return parse_json(path);
  };
  std::map<std::string, AddedToken> found;  // content -> token
  std::set<std::string> special;
  const json map = optional_json("special_tokens_map.json");
  if (!map.is_null() && !map.is_object()) throw TokenizerError("'" + folder + "/special_tokens_map.json' is not a JSON object");
  auto content_of = [&](const json& v) -> std::string {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
    throw TokenizerError("'" + folder + "/special_tokens_map.json': a token is neither a string nor {\"content\": ...}");
  };
  const json no_map = json::object();
  const json& entries = map.is_object() ? map : no_map;  // (a temporary here would die before the loop)
  // The named ones (bos_token, eos_token, unk_token, pad_token, ...). Its
  // additional_special_tokens list is left out, as transformers 5 leaves it
  // (tokenizer_config.json's added_tokens_decoder says which are special).
  for (const auto& [key, v] : entries.items()) {
    if (!v.is_array() && !v.is_null()) special.insert(content_of(v));
  }
  const json added = optional_json("added_tokens.json");
  if (!added.is_null()) {
    if (!added.is_object()) throw TokenizerError("'" + folder + "/added_tokens.json' is not an object of token -> id");
    for (const auto& [content, id] : added.items())
      found[content] = {content, token_id(id, "'" + folder + "/added_tokens.json': token '" + content + "'", added.size() + vocab_.size()),
                        special.count(content) > 0, false, false};
  }
  const json config = optional_json("tokenizer_config.json");
  if (config.is_object() && config.contains("added_tokens_decoder")) {
    const json& decoder = config["added_tokens_decoder"];
    std::string where = "'" + folder + "/tokenizer_config.json': added_tokens_decoder";
    if (!decoder.is_object()) throw TokenizerError(where + " is not an object of id -> token");
    for (const auto& [key, a] : decoder.items()) {
      char* end = nullptr;
      long long id = std::strtoll(key.c_str(), &end, 10);
      const long long bound = static_cast<long long>(2 * (vocab_.size() + decoder.size())) + (1 << 16);
      if (key.empty() || *end != '\0' || id < 0 || id >= bound)
        throw TokenizerError(where + ": '" + key + "' is not a token id in 0.." + std::to_string(bound - 1));
      if (!a.is_object() || !a.contains("content") || !a["content"].is_string())
        throw TokenizerError(where + ": entry " + key + " has no content");
      std::string content = a["content"].get<std::string>();
      if (flag(a, "single_word", false)) throw TokenizerError(where + ": '" + content + "' has single_word; not supported");
      if (auto it = found.find(content); it != found.end() && it->second.id != id)
        throw TokenizerError(where + ": '" + content + "' has id " + key + ", but added_tokens.json gives " + std::to_string(it->second.id));
      found[content] = {content, id, flag(a, "special", special.count(content) > 0), flag(a, "lstrip", false), flag(a, "rstrip", false)};
    }
  }
  // special tokens that are in the vocabulary itself (GPT-2's <|endoftext|>): never split either
  special.insert("<|endoftext|>");
  for (const auto& content : special) {
    auto it = vocab_.find(content);
    if (it != vocab_.end() && !found.count(content)) found[content] = {content, it->second, true, false, false};
  }
  for (auto& [content, a] : found) {
    if (auto it = vocab_.find(content); it != vocab_.end() && it->second != a.id)
      throw TokenizerError("'" + folder + "': added token '" + content + "' has id " + std::to_string(a.id) +
                           ", but vocab.json gives it " + std::to_string(it->second));
    added_.push_back(a);
  }
}

void BpeTokenizer::finish_loading(const std::string& where) {
  int64_t n = 0;
  for (const auto& [token, id] : vocab_) n = std::max(n, id + 1);
  for (const auto& a : added_) n = std::max(n, a.id + 1);
  id_to_token_.assign(static_cast<size_t>(n), "");
  special_.assign(static_cast<size_t>(n), false);
  for (const auto& [token, id] : vocab_) {
    if (id < 0) throw TokenizerError("'" + where + "': token '" + token + "' has a negative id");
    // an empty token, or two tokens with one id, would make decoding ambiguous
    if (token.empty()) throw TokenizerError("'" + where + "': the vocabulary has an empty token (id " + std::to_string(id) + ")");
    std::string& slot = id_to_token_[static_cast<size_t>(id)];
    if (!slot.empty())
      throw TokenizerError("'" + where + "': tokens '" + slot + "' and '" + token + "' have the same id " + std::to_string(id));
    slot = token;
  }
  for (const auto& a : added_) {
    if (a.id < 0) throw TokenizerError("'" + where + "': added token '" + a.content + "' has a negative id");
    id_to_token_[static_cast<size_t>(a.id)] = a.content;
    special_[static_cast<size_t>(a.id)] = a.special;
  }
  std::stable_sort(added_.begin(), added_.end(), [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  // the template's special tokens must be tokens: encode puts them in every sequence
  for (const auto* ids : {&prefix_, &suffix_})
    for (int64_t id : *ids)
      if (id < 1 || id > n || id_to_token_[static_cast<size_t>(id - 1)].empty())
        throw TokenizerError("'" + where + "': post_processor: special token id " + std::to_string(id - 1) +
                             " is neither in the vocabulary nor an added token");
}

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

// The readers above index the JSON as the format has it (at, get); a file
// that is valid JSON of another layout (a key missing, a number where a
// string belongs) is the same TokenizerError, naming the file and what broke.
std::unique_ptr<BpeTokenizer> BpeTokenizer::from_tokenizer_json(const std::string& path) {
  try {
    return read_tokenizer_json(path);
  } catch (const json::exception& e) {
    throw TokenizerError("'" + path + "' is not a tokenizer.json anatomy can read: " + json_message(e));
  }
}

std::unique_ptr<BpeTokenizer> BpeTokenizer::from_vocab_merges(const std::string& vocab_json, const std::string& merges_txt) {
  try {
    return read_vocab_merges(vocab_json, merges_txt);
  } catch (const json::exception& e) {
    throw TokenizerError("'" + vocab_json + "' is not a vocab.json of token -> id: " + json_message(e));
  }
}

}  // namespace anatomy::io
