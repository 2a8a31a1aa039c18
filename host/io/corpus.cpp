// Corpora and tokenizers (see corpus.h).
#include "host/io/corpus.h"
#include "host/io/digest.h"
#include "host/runtime.h"

#include <ATen/ATen.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <stdexcept>

namespace anatomy::io {
namespace {

// The next UTF-8 code point of text at i (advancing i). A byte that does not
// start a valid sequence stands for itself (read as Latin-1).
// A byte that does not start a well-formed UTF-8 character (Latin-1 text, a
// cut sequence, an overlong form, a surrogate) is its own symbol, numbered
// past Unicode, so that it never merges with a real character and is written
// back as the same byte: every text round-trips.
constexpr uint32_t kRawByte = 0x110000;

uint32_t next_code_point(std::string_view text, size_t& i) {
  unsigned char c = static_cast<unsigned char>(text[i]);
  int extra = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xe ? 2 : (c >> 3) == 0x1e ? 3 : -1;
  if (extra == 0) {
    ++i;
    return c;
  }
  if (extra < 0 || i + extra >= text.size()) {
    ++i;
    return kRawByte + c;
  }
  uint32_t cp = c & (0x3f >> extra);
  for (int k = 1; k <= extra; ++k) {
    unsigned char cc = static_cast<unsigned char>(text[i + k]);
    if ((cc >> 6) != 0x2) {
      ++i;
      return kRawByte + c;
    }
    cp = (cp << 6) | (cc & 0x3f);
  }
  static const uint32_t smallest[] = {0, 0x80, 0x800, 0x10000};
  if (cp < smallest[extra] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
    ++i;
    return kRawByte + c;
  }
  i += extra + 1;
  return cp;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp >= kRawByte) {
    out += static_cast<char>(cp - kRawByte);
  } else if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

std::string describe_char(uint32_t cp) {
  char buf[48];
  if (cp >= kRawByte) {
    std::snprintf(buf, sizeof buf, "byte 0x%02X (not UTF-8)", cp - kRawByte);
    return buf;
  }
  std::snprintf(buf, sizeof buf, "U+%04X", cp);
  std::string shown;
  append_utf8(shown, cp);
  return "'" + shown + "' (" + buf + ")";
}

class CharTokenizer : public Tokenizer {
 public:
  explicit CharTokenizer(std::string_view text) {
    std::vector<bool> seen_ascii(128, false);
    std::map<uint32_t, int> other;
    for (size_t i = 0; i < text.size();) {
      uint32_t cp = next_code_point(text, i);
      if (cp < 128) seen_ascii[cp] = true;
      else other[cp] = 0;
    }
    for (uint32_t c = 0; c < 128; ++c)
      if (seen_ascii[c]) chars_.push_back(c);
    for (const auto& kv : other) chars_.push_back(kv.first);
    for (size_t k = 0; k < chars_.size(); ++k) index_[chars_[k]] = static_cast<int64_t>(k + 1);
  }
  std::string kind() const override { return "char"; }
  int64_t vocab_size() const override { return static_cast<int64_t>(chars_.size()); }
  std::vector<int64_t> encode(std::string_view text) const override {
    std::vector<int64_t> ids;
    ids.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
      uint32_t cp = next_code_point(text, i);
      auto it = index_.find(cp);
      if (it == index_.end()) throw std::invalid_argument("character " + describe_char(cp) + " is not in the vocabulary");
      ids.push_back(it->second);
    }
    return ids;
  }
  std::string decode(const std::vector<int64_t>& ids) const override {
    std::string out;
    for (int64_t id : ids) {
      if (id < 1 || id > vocab_size())
        throw std::out_of_range("token id " + std::to_string(id) + " is out of range 1.." + std::to_string(vocab_size()));
      append_utf8(out, chars_[id - 1]);
    }
    return out;
  }

 private:
  std::vector<uint32_t> chars_;
  std::map<uint32_t, int64_t> index_;
};

class ByteTokenizer : public Tokenizer {
 public:
  std::string kind() const override { return "byte"; }
  int64_t vocab_size() const override { return 256; }
  std::vector<int64_t> encode(std::string_view text) const override {
    std::vector<int64_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]) + 1;
    return ids;
  }
  std::string decode(const std::vector<int64_t>& ids) const override {
    std::string out;
    for (int64_t id : ids) {
      if (id < 1 || id > 256) throw std::out_of_range("token id " + std::to_string(id) + " is out of range 1..256");
      out += static_cast<char>(id - 1);
    }
    return out;
  }
};

// ---- SentencePiece, through the plugin (host/io/sentencepiece_plugin.cpp) ----

struct SpmApi {
  int (*train)(const char*, char*, size_t);
  void* (*load)(const char*, char*, size_t);
  void (*free_model)(void*);
  int (*vocab_size)(void*);
  int (*encode)(void*, const char*, size_t, int**, size_t*, char*, size_t);
  int (*decode)(void*, const int*, size_t, char**, size_t*, char*, size_t);
};

std::string plugin_path() {
  if (const char* env = std::getenv("ANATOMY_SPM_PLUGIN"); env && *env) return env;
  std::error_code ec;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  std::vector<std::filesystem::path> candidates = {
      exe.parent_path() / "libanatomy_sentencepiece.so",                        // the build tree
      exe.parent_path().parent_path() / "lib" / "anatomy" / "libanatomy_sentencepiece.so",  // an install
      ANATOMY_PLUGIN_DIR "/libanatomy_sentencepiece.so",
  };
  for (const auto& c : candidates)
    if (std::filesystem::exists(c, ec)) return c.string();
  return candidates.front().string();
}

const SpmApi& spm_api() {
  static SpmApi api = [] {
#if defined(__SANITIZE_ADDRESS__) || defined(ANATOMY_SANITIZE)  // gcc defines the first, clang neither
    throw std::runtime_error("SentencePiece is not available in a sanitizer build (its plugin needs RTLD_DEEPBIND, "
                             "which AddressSanitizer does not support)");
#endif
    std::string path = plugin_path();
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (!lib)
      throw std::runtime_error(std::string("cannot load the SentencePiece plugin: ") + dlerror() +
                               "\n---> HINT: build anatomy with libsentencepiece-dev installed, or set ANATOMY_SPM_PLUGIN");
    SpmApi a{};
    auto sym = [&](const char* name) {
      void* f = dlsym(lib, name);
      if (!f) throw std::runtime_error(std::string("the SentencePiece plugin lacks ") + name);
      return f;
    };
    a.train = reinterpret_cast<decltype(a.train)>(sym("anatomy_spm_train"));
    a.load = reinterpret_cast<decltype(a.load)>(sym("anatomy_spm_load"));
    a.free_model = reinterpret_cast<decltype(a.free_model)>(sym("anatomy_spm_free"));
    a.vocab_size = reinterpret_cast<decltype(a.vocab_size)>(sym("anatomy_spm_vocab_size"));
    a.encode = reinterpret_cast<decltype(a.encode)>(sym("anatomy_spm_encode"));
    a.decode = reinterpret_cast<decltype(a.decode)>(sym("anatomy_spm_decode"));
    return a;
  }();
  return api;
}

// SentencePiece pieces; its ids 0..V-1 are ours 1..V.
class SentencePieceTokenizer : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& model_path) : api_(spm_api()) {
    char err[512] = "";
    model_ = api_.load(model_path.c_str(), err, sizeof err);
    if (!model_) throw std::runtime_error("cannot load SentencePiece model '" + model_path + "': " + err);
    vocab_ = api_.vocab_size(model_);
  }
  ~SentencePieceTokenizer() override { api_.free_model(model_); }
  std::string kind() const override { return "sentencepiece"; }
  int64_t vocab_size() const override { return vocab_; }
  std::vector<int64_t> encode(std::string_view text) const override {
    int* pieces = nullptr;
    size_t n = 0;
    char err[512] = "";
    if (api_.encode(model_, text.data(), text.size(), &pieces, &n, err, sizeof err) != 0)
      throw std::invalid_argument(std::string("SentencePiece could not encode the text: ") + err);
    std::vector<int64_t> ids(n);
    for (size_t i = 0; i < n; ++i) ids[i] = pieces[i] + 1;
    std::free(pieces);
    return ids;
  }
  std::string decode(const std::vector<int64_t>& ids) const override {
    std::vector<int> pieces;
    for (int64_t id : ids) {
      if (id < 1 || id > vocab_)
        throw std::out_of_range("token id " + std::to_string(id) + " is out of range 1.." + std::to_string(vocab_));
      pieces.push_back(static_cast<int>(id - 1));
    }
    char* text = nullptr;
    size_t n = 0;
    char err[512] = "";
    if (api_.decode(model_, pieces.data(), pieces.size(), &text, &n, err, sizeof err) != 0)
      throw std::invalid_argument(std::string("SentencePiece could not decode: ") + err);
    std::string out(text, n);
    std::free(text);
    return out;
  }

 private:
  const SpmApi& api_;
  void* model_ = nullptr;
  int64_t vocab_ = 0;
};

}  // namespace

std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::string& model_path) {
  return std::make_unique<SentencePieceTokenizer>(model_path);
}

std::string train_sentencepiece(const std::string& text_path, int64_t vocab_size, const std::string& type) {
  if (type != "bpe" && type != "unigram")
    throw std::invalid_argument("SentencePiece model type must be 'bpe' or 'unigram', got '" + type + "'");
  namespace fs = std::filesystem;
  // Cached beside the text, or in anatomy's cache folder (runtime.h) when that folder is read-only.
  fs::path text(text_path);
  fs::path dir = text.has_parent_path() ? text.parent_path() : fs::path(".");
  // A folder without write bits counts as read-only even for root, who could write anyway.
  struct stat st {};
  bool writable = stat(dir.c_str(), &st) == 0 && (st.st_mode & (S_IWUSR | S_IWGRP | S_IWOTH)) &&
                  access(dir.c_str(), W_OK) == 0;
  if (!writable) {
    dir = fs::path(cache_dir());
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw std::runtime_error("cannot create the cache folder " + dir.string() + ": " + ec.message());
  }
  std::string prefix = (dir / (text.filename().string() + ".sp" + std::to_string(vocab_size) + "." + type)).string();
  std::string model = prefix + ".model";
  if (access(model.c_str(), R_OK) == 0) return model;
  const SpmApi& api = spm_api();
  std::string tmp = prefix + ".tmp" + std::to_string(getpid());
  std::string flags = "--input=" + text_path + " --model_prefix=" + tmp + " --vocab_size=" + std::to_string(vocab_size) +
                      " --model_type=" + type + " --character_coverage=1.0 --hard_vocab_limit=false" +
                      " --minloglevel=2 --max_sentence_length=16384 --input_sentence_size=2000000" +
                      " --shuffle_input_sentence=true --num_threads=2";
  char err[512] = "";
  int rc = api.train(flags.c_str(), err, sizeof err);
  if (rc != 0) {
    std::remove((tmp + ".model").c_str());
    std::remove((tmp + ".vocab").c_str());
    throw std::runtime_error("SentencePiece training on '" + text_path + "' failed: " + err);
  }
  std::rename((tmp + ".vocab").c_str(), (prefix + ".vocab").c_str());
  if (std::rename((tmp + ".model").c_str(), model.c_str()) != 0)
    throw std::runtime_error("cannot write the SentencePiece model " + model + ": " + std::strerror(errno));
  return model;
}

MappedFile::MappedFile(const std::string& path) {
  check_regular_file(path);  // "'PATH' is a directory", before open (which a FIFO would block)
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error("cannot open '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    throw std::runtime_error("'" + path + "' is not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      close(fd);
      throw std::runtime_error("cannot map '" + path + "': " + std::strerror(errno));
    }
    data_ = static_cast<const char*>(p);
  }
  close(fd);
}

MappedFile::~MappedFile() {
  if (data_) munmap(const_cast<char*>(data_), size_);
}

std::unique_ptr<Tokenizer> make_char_tokenizer(std::string_view text) { return std::make_unique<CharTokenizer>(text); }
std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

Corpus::Corpus(std::unique_ptr<Tokenizer> tokenizer, at::Tensor tokens, double train_fraction)
    : tokenizer_(std::move(tokenizer)), tokens_(std::move(tokens)) {
  if (!(train_fraction > 0 && train_fraction <= 1))
    throw std::invalid_argument("split must be in (0, 1], got " + std::to_string(train_fraction));
  train_end_ = static_cast<int64_t>(static_cast<double>(tokens_.numel()) * train_fraction);
}

at::Tensor Corpus::split(const std::string& name) const {
  if (name == "train") return tokens_.narrow(0, 0, train_end_);
  if (name == "val") return tokens_.narrow(0, train_end_, tokens_.numel() - train_end_);
  throw std::invalid_argument("split must be 'train' or 'val', got '" + name + "'");
}

std::pair<at::Tensor, at::Tensor> Corpus::batch(int64_t B, int64_t T, const std::string& split_name) const {
  at::Tensor ids = split(split_name);
  if (B < 1 || T < 1) throw std::invalid_argument("batch size and length must be positive");
  if (ids.numel() < T + 1)
    throw std::invalid_argument("the " + split_name + " split has " + std::to_string(ids.numel()) +
                                " tokens, too few for windows of " + std::to_string(T) + " plus a target");
  at::Tensor starts = at::randint(0, ids.numel() - T, {B, 1}, at::kLong);   // (B, 1)
  at::Tensor index = starts + at::arange(T, at::kLong);                       // (B, T)
  return {ids.index_select(0, index.reshape({-1})).reshape({B, T}),
          ids.index_select(0, (index + 1).reshape({-1})).reshape({B, T})};
}

std::unique_ptr<Corpus> make_corpus(std::unique_ptr<Tokenizer> tok, std::string_view text, double train_fraction) {
  std::vector<int64_t> ids = tok->encode(text);
  at::Tensor tokens = at::tensor(ids, at::kLong);
  if (ids.empty()) tokens = at::empty({0}, at::kLong);
  return std::make_unique<Corpus>(std::move(tok), tokens, train_fraction);
}

std::unique_ptr<Corpus> make_text_corpus(std::string_view text, const std::string& tokenizer, double train_fraction) {
  if (tokenizer == "char") return make_corpus(make_char_tokenizer(text), text, train_fraction);
  if (tokenizer == "byte") return make_corpus(make_byte_tokenizer(), text, train_fraction);
  throw std::invalid_argument("unknown tokenizer '" + tokenizer + "', expected char or byte");
}

std::unique_ptr<Corpus> load_text_corpus(const std::string& path, std::unique_ptr<Tokenizer> tokenizer, double train_fraction) {
  MappedFile file(path);
  return make_corpus(std::move(tokenizer), file.text(), train_fraction);
}

std::unique_ptr<Corpus> load_text_corpus(const std::string& path, const TokenizerSpec& spec, double train_fraction) {
  MappedFile file(path);
  if (spec.kind == "sentencepiece") {
    std::string model = spec.model.empty() ? train_sentencepiece(path, spec.vocab_size, spec.type) : spec.model;
    return make_corpus(make_sentencepiece_tokenizer(model), file.text(), train_fraction);
  }
  if (spec.kind != "char" && spec.kind != "byte")
    throw std::invalid_argument("unknown tokenizer '" + spec.kind + "', expected char, byte or sentencepiece");
  return make_text_corpus(file.text(), spec.kind, train_fraction);
}

}  // namespace anatomy::io
