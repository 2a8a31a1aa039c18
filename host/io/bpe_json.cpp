// Reading a BPE tokenizer's files (see bpe.h): Hugging Face's tokenizer.json,
// part by part (model, normalizer, pre-tokenizer, decoder, added tokens,
// post-processor), or GPT-2's vocab.json + merges.txt with the added tokens
// transformers saves beside them. What a file asks for and this does not do
// is a TokenizerError naming the file and the key. Encoding and decoding are
// bpe.cpp's.
#include "host/io/bpe.h"
#include "host/io/bpe_text.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>

#include <unistd.h>

namespace anatomy::io {

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

// "'<path>': <key>": where in a file a TokenizerError points.
std::string where_in(const std::string& path, const std::string& key) { return "'" + path + "': " + key; }

}  // namespace

// Metaspace's prepend_scheme (tokenizers >= 0.14), or its older add_prefix_space.
BpeTokenizer::Prepend BpeTokenizer::metaspace_prepend(const json& p, const std::string& key) {
  if (p.contains("prepend_scheme") && !p["prepend_scheme"].is_null()) {
    std::string v = p["prepend_scheme"].get<std::string>();
    if (v == "first") return Prepend::first;
    if (v == "always") return Prepend::always;
    if (v == "never") return Prepend::never;
    throw TokenizerError(key + " is '" + v + "'; expected first, always or never");
  }
  return flag(p, "add_prefix_space", true) ? Prepend::always : Prepend::never;
}

std::unique_ptr<BpeTokenizer> BpeTokenizer::read_tokenizer_json(const std::string& path) {
  json j = parse_json(path);
  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer());
  if (!j.contains("model") || !j["model"].is_object()) throw TokenizerError(where_in(path, "model") + " is missing");
  const size_t entries = j["model"].value("vocab", json::object()).size() + j.value("added_tokens", json::array()).size();
  t->read_model(j["model"], path);
  t->read_normalizer(j.value("normalizer", json()), path);
  t->read_vocab(j["model"], path, entries);
  t->read_pre_tokenizer(j.value("pre_tokenizer", json()), path);
  t->read_decoder(j.value("decoder", json()), path);
  t->read_added(j.value("added_tokens", json::array()), path, entries);
  t->read_post_processor(j.value("post_processor", json()), path, entries);
  t->finish_loading(path);
  return t;
}

// The model's kind and settings: BPE, without dropout or word affixes.
void BpeTokenizer::read_model(const json& model, const std::string& path) {
  auto where = [&](const std::string& key) { return where_in(path, key); };
  std::string type = model.value("type", "BPE");
  if (type != "BPE") throw TokenizerError(where("model.type") + " is '" + type + "'; only BPE is supported");
  if (!model.value("dropout", json()).is_null()) throw TokenizerError(where("model.dropout") + " is set; BPE dropout is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(key) && !model[key].is_null() && model[key] != "")
      throw TokenizerError(where(std::string("model.") + key) + " is set; not supported");
  byte_fallback_ = flag(model, "byte_fallback", false);
  fuse_unk_ = flag(model, "fuse_unk", false);
}

void BpeTokenizer::read_normalizer(const json& norm, const std::string& path) {
  auto where = [&](const std::string& key) { return where_in(path, key); };
  // The normalizer: NFC (Qwen2), or SentencePiece's Prepend("▁") and
  // Replace(" " -> "▁") (Llama 2), alone or in a Sequence.
  auto normalizer = [&](const json& n) {
    std::string kind = n.value("type", "?");
    if (kind == "NFC") {
      nfc_ = true;
    } else if (kind == "Prepend") {
      prepend_ = Prepend::always;  // each segment between added tokens, as tokenizers normalizes each
      space_ = n.value("prepend", "");
    } else if (kind == "Replace" && n.contains("pattern") && n["pattern"].contains("String") && n["pattern"]["String"] == " ") {
      space_ = n.value("content", "");
      replaces_spaces_ = !space_.empty();
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
  if (prepend_ == Prepend::always && space_.empty())
    throw TokenizerError(where("normalizer") + ": a Prepend without a Replace of spaces by the same character is not supported");
}

// The vocabulary (token -> id), the merges by rank, the unknown token.
void BpeTokenizer::read_vocab(const json& model, const std::string& path, size_t entries) {
  auto where = [&](const std::string& key) { return where_in(path, key); };
  if (!model.contains("vocab") || !model["vocab"].is_object()) throw TokenizerError(where("model.vocab") + " must be an object of token -> id");
  if (!model.contains("merges") || !model["merges"].is_array()) throw TokenizerError(where("model.merges") + " must be a list");
  for (const auto& [token, id] : model.at("vocab").items()) vocab_[token] = token_id(id, where("model.vocab '" + token + "'"), entries);
  int rank = 0;
  for (const auto& m : model.at("merges")) {
    std::string key = m.is_string() ? m.get<std::string>() : m.at(0).get<std::string>() + " " + m.at(1).get<std::string>();
    merge_rank_.emplace(key, rank++);
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    auto it = vocab_.find(model["unk_token"].get<std::string>());
    if (it != vocab_.end()) unk_ = it->second;
  }
  ignore_merges_ = flag(model, "ignore_merges", false);
}

void BpeTokenizer::read_pre_tokenizer(const json& pre, const std::string& path) {
  auto where = [&](const std::string& key) { return where_in(path, key); };
  // The pre-tokenizer: ByteLevel alone (GPT-2's pattern), or a Split pattern
  // followed by ByteLevel without its own pattern (Llama 3, Qwen2); Metaspace,
  // or none after the Prepend + Replace normalizers (SentencePiece-style).
  auto byte_level = [&](const json& p, bool alone) {
    add_prefix_space_ = flag(p, "add_prefix_space", false);
    if (flag(p, "use_regex", true)) {
      if (!alone) throw TokenizerError(where("pre_tokenizer") + ": a Split before a ByteLevel with use_regex is not supported");
      set_split(kGpt2Pattern, path);
    }
  };
  auto split = [&](const json& p) {
    std::string behavior = p.value("behavior", "Isolated");
    if (behavior != "Isolated") throw TokenizerError(where("pre_tokenizer Split.behavior") + " is '" + behavior + "'; only Isolated is supported");
    if (flag(p, "invert", false)) throw TokenizerError(where("pre_tokenizer Split.invert") + " is true; not supported");
    const json& pattern = p.at("pattern");
    if (!pattern.contains("Regex")) throw TokenizerError(where("pre_tokenizer Split.pattern") + ": only Regex patterns are supported");
    set_split(pattern["Regex"].get<std::string>(), path);
  };
  std::string pre_type = pre.is_null() ? "none" : pre.value("type", "?");
  if (pre_type == "ByteLevel") {
    byte_level(pre, true);
  } else if (pre_type == "Sequence" && pre.contains("pretokenizers") && pre["pretokenizers"].size() == 2 &&
             pre["pretokenizers"][0].value("type", "") == "Split" && pre["pretokenizers"][1].value("type", "") == "ByteLevel") {
    split(pre["pretokenizers"][0]);
    byte_level(pre["pretokenizers"][1], false);
  } else if (pre_type == "Metaspace") {
    if (!space_.empty()) throw TokenizerError(where("pre_tokenizer") + ": a Metaspace after a normalizer that already replaces spaces is not supported");
    byte_level_ = false;
    space_ = pre.value("replacement", std::string(kSpace));
    prepend_ = metaspace_prepend(pre, where("pre_tokenizer Metaspace.prepend_scheme"));
    prepend_if_missing_ = true;
    split_at_space_ = flag(pre, "split", true);
  } else if (pre_type == "none" && !space_.empty()) {
    byte_level_ = false;  // the normalizers did the work (Llama 2's tokenizer.json)
  } else if (pre_type == "Split" && replaces_spaces_ && pre.contains("pattern") && pre["pattern"].is_object() &&
             pre["pattern"].value("String", json()) == " " && !flag(pre, "invert", false)) {
    // Gemma's (transformers' GemmaConverter): a Split at ' ' after the normalizer
    // has replaced every ' ', so it finds none and leaves the text whole
    byte_level_ = false;
  } else {
    throw TokenizerError(where("pre_tokenizer") + " is '" + pre_type +
                         "'; supported: ByteLevel, a Sequence of Split and ByteLevel, Metaspace, or none (or a Split "
                         "at ' ') after the Prepend and Replace normalizers");
  }
  if (byte_level_ && (byte_fallback_ || !space_.empty()))
    throw TokenizerError(where(byte_fallback_ ? "model.byte_fallback" : "normalizer") +
                         ": SentencePiece-style settings with a ByteLevel pre-tokenizer are not supported");
  if (byte_level_ && prepend_ != Prepend::never)
    throw TokenizerError(where("normalizer") + ": Prepend with a ByteLevel pre-tokenizer is not supported");
}

void BpeTokenizer::read_decoder(const json& dec, const std::string& path) {
  auto where = [&](const std::string& key) { return where_in(path, key); };
  // The decoder: ByteLevel for byte-level BPE; for SentencePiece-style, a
  // chain of Replace, ByteFallback, Fuse, Strip, or a Metaspace.
  if (byte_level_) {
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
      decoder_.push_back(s);
    };
    if (dec.is_null()) throw TokenizerError(where("decoder") + " is missing; a SentencePiece-style BPE needs one");
    if (dec.value("type", "") == "Sequence") {
      for (const auto& d : dec.value("decoders", json::array())) step(d);
    } else {
      step(dec);
    }
  }
}

// The added tokens, matched in the text before BPE, each as one token.
void BpeTokenizer::read_added(const json& added, const std::string& path, size_t entries) {
  auto where = [&](const std::string& key) { return where_in(path, key); };
  for (const auto& a : added) {
    if (flag(a, "single_word", false))
      throw TokenizerError(where("added_tokens") + ": '" + a.value("content", "") + "' has single_word; not supported");
    added_.push_back({a.at("content").get<std::string>(), token_id(a.at("id"), where("added_tokens"), entries), flag(a, "special", false),
                         flag(a, "lstrip", false), flag(a, "rstrip", false)});
  }
}

void BpeTokenizer::read_post_processor(const json& post, const std::string& path, size_t entries) {
  auto where = [&](const std::string& key) { return where_in(path, key); };
  // The post-processor: ByteLevel (nothing to add), or a template of special
  // tokens around the text.
  auto add_template = [&](const json& tp) {
    bool before = true;
    for (const auto& piece : tp.at("single")) {
      if (piece.contains("Sequence")) {
        before = false;
        continue;
      }
      std::string name = piece.at("SpecialToken").at("id").get<std::string>();
      const json& ids = tp.at("special_tokens").at(name).at("ids");
      for (const auto& id : ids) (before ? prefix_ : suffix_).push_back(token_id(id, where("post_processor"), entries) + 1);
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
  t->set_split(kGpt2Pattern, vocab_json);
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
  // The named special tokens as transformers reads them, from
  // tokenizer_config.json too (bos_token, eos_token, ...), in its order. One
  // the vocabulary lacks is appended after everything else (GPT2Tokenizer:
  // id = len(tokenizer) then), as one token.
  std::vector<std::string> named;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    for (const json* from : {&config, &entries}) {
      if (from->is_object() && from->contains(key) && !(*from)[key].is_null()) {
        std::string content = content_of((*from)[key]);
        special.insert(content);
        if (std::find(named.begin(), named.end(), content) == named.end()) named.push_back(content);
        break;
      }
    }
  }
  // special tokens that are in the vocabulary itself (GPT-2's <|endoftext|>): never split either
  special.insert("<|endoftext|>");
  for (const auto& content : special) {
    auto it = vocab_.find(content);
    if (it != vocab_.end() && !found.count(content)) found[content] = {content, it->second, true, false, false};
  }
  int64_t next = 0;
  for (const auto& [token, id] : vocab_) next = std::max(next, id + 1);
  for (const auto& [content, a] : found) next = std::max(next, a.id + 1);
  for (const auto& content : named) {
    if (!vocab_.count(content) && !found.count(content)) found[content] = {content, next++, true, false, false};
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
