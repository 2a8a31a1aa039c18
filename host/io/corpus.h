// Text corpora for training: a memory-mapped file, a tokenizer (characters,
// bytes or SentencePiece), the token ids as one tensor, a train/val split and
// random windows of it as batches. Token ids are 1-based, as every index in
// anatomy: a vocabulary of V tokens uses ids 1..V.
#pragma once
#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace anatomy::io {

/// A read-only memory map of a whole file (empty files map to nothing).
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::string_view text() const { return {data_, size_}; }

 private:
  const char* data_ = nullptr;
  size_t size_ = 0;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  /// "char" or "byte"
  virtual std::string kind() const = 0;
  virtual int64_t vocab_size() const = 0;
  /// Ids (1-based) of a text; throws std::invalid_argument for text the vocabulary cannot express.
  virtual std::vector<int64_t> encode(std::string_view text) const = 0;
  /// The text of ids (1-based); throws std::out_of_range for an id outside 1..vocab_size.
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
};

/// Characters (UTF-8 code points) that occur in the training text, sorted;
/// a byte that is not part of well-formed UTF-8 is a symbol of its own, after
/// them, so that every text decodes back to its exact bytes.
std::unique_ptr<Tokenizer> make_char_tokenizer(std::string_view text);
/// The 256 byte values: id = byte + 1.
std::unique_ptr<Tokenizer> make_byte_tokenizer();

/// A tokenized text split into a training part (the first `train_fraction`
/// of the tokens) and a validation part (the rest).
class Corpus {
 public:
  Corpus(std::unique_ptr<Tokenizer> tokenizer, at::Tensor tokens, double train_fraction);

  const Tokenizer& tokenizer() const { return *tokenizer_; }
  /// All token ids, int64, 1-based.
  const at::Tensor& tokens() const { return tokens_; }
  /// The ids of one split: "train" or "val".
  at::Tensor split(const std::string& name) const;
  /// B random windows of T tokens from a split, and the same windows shifted
  /// by one token (the targets). Draws from LibTorch's default generator.
  std::pair<at::Tensor, at::Tensor> batch(int64_t B, int64_t T, const std::string& split_name) const;

 private:
  std::unique_ptr<Tokenizer> tokenizer_;
  at::Tensor tokens_;
  int64_t train_end_;
};

/// A SentencePiece model file (.model), through the plugin library.
std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::string& model_path);
/// Trains a SentencePiece model ("bpe" or "unigram") on a text file, or finds
/// the one trained before; returns its path. Cached beside the text as
/// NAME.sp<vocab>.<type>.model, or in ~/.cache/anatomy if that folder is read-only.
std::string train_sentencepiece(const std::string& text_path, int64_t vocab_size, const std::string& type);

/// Which tokenizer a corpus uses.
struct TokenizerSpec {
  std::string kind = "char";  ///< "char", "byte" or "sentencepiece"
  int64_t vocab_size = 4000;  ///< sentencepiece: the vocabulary to train
  std::string type = "bpe";   ///< sentencepiece: "bpe" or "unigram"
  std::string model;          ///< sentencepiece: an existing .model file (no training)
};

/// Reads `path` through a memory map (never a copy of the whole text) and tokenizes it.
std::unique_ptr<Corpus> load_text_corpus(const std::string& path, const TokenizerSpec& spec, double train_fraction);
/// A text file tokenized with a tokenizer made elsewhere (a pretrained model's).
std::unique_ptr<Corpus> load_text_corpus(const std::string& path, std::unique_ptr<Tokenizer> tokenizer, double train_fraction);
/// The same for text already in memory.
std::unique_ptr<Corpus> make_text_corpus(std::string_view text, const std::string& tokenizer, double train_fraction);

}  // namespace anatomy::io
