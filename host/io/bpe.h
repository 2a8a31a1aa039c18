// BPE as Hugging Face's `tokenizers` applies it, read from a `tokenizer.json`
// (or GPT-2's `vocab.json` + `merges.txt`). Two kinds:
//  - byte-level (GPT-2, GPT-J, Pythia, Llama 3, Qwen2/3, OLMo 2): added tokens split out
//    first, the pre-tokenizer's split pattern (PCRE2, with Unicode
//    properties), bytes mapped to printable characters, merges by rank;
//  - SentencePiece-style (Llama 2, Mistral, TinyLlama, Phi-3, Gemma): spaces
//    become "▁" (a Metaspace pre-tokenizer, or the Replace normalizer, with
//    Prepend where the text gets a leading "▁"), merges
//    over characters, a character outside the vocabulary spelled as its
//    bytes' <0xNN> tokens (byte_fallback), unknown runs fused into one unk;
//    decoded through the file's decoder chain (Replace, ByteFallback, Fuse,
//    Strip, Metaspace).
// Then the post-processor's template (a BOS token, say). What a file asks for
// and this does not do is refused by name, never approximated.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "host/io/corpus.h"

namespace anatomy::io {

/// A tokenizer file that cannot be read or asks for something unsupported;
/// the message names the file and the key.
struct TokenizerError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class BpeTokenizer : public Tokenizer {
 public:
  /// The tokenizer as a corpus uses it: a text's ids without the
  /// post-processor's special tokens (a running text is not one sequence).
  static std::unique_ptr<Tokenizer> for_corpus(std::shared_ptr<const BpeTokenizer> tokenizer);
  /// A Hugging Face tokenizer.json (model.type "BPE" over byte-level pieces).
  static std::unique_ptr<BpeTokenizer> from_tokenizer_json(const std::string& path);
  /// How transformers' LlamaTokenizer reads a SentencePiece `tokenizer.model`
  /// (its settings from tokenizer_config.json).
  struct SentencePieceSettings {
    bool add_bos_token = false, add_eos_token = false;  // transformers 5's defaults (Llama's config sets add_bos_token)
    bool add_prefix_space = true;  // a "▁" before the text
    bool legacy = false;           // before every segment between added tokens, not only the first
  };
  /// A SentencePiece BPE model file, turned into the tokenizer transformers 5
  /// builds from it (LlamaTokenizer): the pieces as the vocabulary, merges
  /// ordered by the merged piece's id, byte fallback, a Metaspace, control
  /// and user-defined pieces as added tokens, a BOS/EOS template.
  static std::unique_ptr<BpeTokenizer> from_sentencepiece_model(const std::string& path, const SentencePieceSettings& settings);
  /// GPT-2's two files: vocab.json (token -> id) and merges.txt.
  static std::unique_ptr<BpeTokenizer> from_vocab_merges(const std::string& vocab_json, const std::string& merges_txt);
  ~BpeTokenizer() override;

  std::string kind() const override { return "bpe"; }
  /// The largest id + 1 (added tokens included), as `len(tokenizer)` in transformers.
  int64_t vocab_size() const override;
  /// 1-based ids with the post-processor's special tokens (as tokenizers'
  /// encode(text) with add_special_tokens=True).
  std::vector<int64_t> encode(std::string_view text) const override { return encode(text, true); }
  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens) const;
  /// The text of 1-based ids; special tokens kept (decode(ids, skip_special_tokens=False)).
  std::string decode(const std::vector<int64_t>& ids) const override { return decode(ids, false); }
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const;
  /// The token string of a 1-based id ("Ġthe"), or nothing.
  std::optional<std::string> id_to_token(int64_t id) const;
  /// The 1-based id of a token string, or nothing.
  std::optional<int64_t> token_to_id(const std::string& token) const;
  /// The ids (1-based) the post-processor puts before and after a text.
  const std::vector<int64_t>& prefix_ids() const { return prefix_; }
  const std::vector<int64_t>& suffix_ids() const { return suffix_; }

 private:
  BpeTokenizer();
  static std::unique_ptr<BpeTokenizer> read_tokenizer_json(const std::string& path);
  static std::unique_ptr<BpeTokenizer> read_vocab_merges(const std::string& vocab_json, const std::string& merges_txt);
  struct Regex;
  struct AddedToken {
    std::string content;
    int64_t id;  // 0-based, as in the file
    bool special, lstrip, rstrip;
  };
  void read_added_tokens(const std::string& vocab_json);
  void finish_loading(const std::string& where);
  void encode_piece(std::string_view piece, std::vector<int64_t>& out) const;
  void encode_plain(std::string_view text, bool first, std::vector<int64_t>& out) const;
  void encode_chars(std::string_view piece, std::vector<int64_t>& out) const;
  std::string decode_chain(const std::vector<std::string>& tokens) const;

  std::unordered_map<std::string, int64_t> vocab_;  // token -> 0-based id
  std::vector<std::string> id_to_token_;            // 0-based id -> token ("" where none)
  std::vector<bool> special_;                       // 0-based id -> a special added token
  std::unordered_map<std::string, int> merge_rank_;  // "a b" -> rank
  std::vector<AddedToken> added_;                   // longest content first
  std::unique_ptr<Regex> split_;                    // the pre-tokenizer's pattern (none: the whole text)
  bool add_prefix_space_ = false;
  bool ignore_merges_ = false;  // a whole piece found in the vocabulary is one token (Llama 3)
  bool nfc_ = false;            // the NFC normalizer (Qwen2)
  std::optional<int64_t> unk_;
  // SentencePiece-style: no byte map; what stands for a space, where it is
  // prepended ("first": the text's first segment only, "always": each segment
  // between added tokens), whether pieces split at it (Metaspace split).
  bool byte_level_ = true;
  bool byte_fallback_ = false, fuse_unk_ = false;
  std::string space_;               // "▁" (empty: spaces stay spaces)
  bool replaces_spaces_ = false;    // the normalizer's Replace(' ' -> space_): no ' ' reaches the pre-tokenizer
  enum class Prepend { never, first, always } prepend_ = Prepend::never;
  bool prepend_if_missing_ = false;  // Metaspace: not when the segment already starts with it
  bool split_at_space_ = false;
  struct DecodeStep {
    enum class Kind { replace, byte_fallback, fuse, strip, metaspace } kind;
    std::string from, to;  // replace; metaspace: from = the replacement
    int start = 0, stop = 0;  // strip: how many `from` characters at each end; metaspace: start = strip the first space
  };
  std::vector<DecodeStep> decoder_;  // SentencePiece-style only
  std::vector<int64_t> prefix_, suffix_;  // 1-based
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache_;

  // Reading tokenizer.json, part by part (bpe_json.cpp); `path` names the file in errors.
  void read_model(const nlohmann::json& model, const std::string& path);
  void read_normalizer(const nlohmann::json& normalizer, const std::string& path);
  void read_vocab(const nlohmann::json& model, const std::string& path, size_t entries);
  void read_pre_tokenizer(const nlohmann::json& pre_tokenizer, const std::string& path);
  void read_decoder(const nlohmann::json& decoder, const std::string& path);
  void read_added(const nlohmann::json& added_tokens, const std::string& path, size_t entries);
  void read_post_processor(const nlohmann::json& post_processor, const std::string& path, size_t entries);
  static Prepend metaspace_prepend(const nlohmann::json& p, const std::string& key);
  /// The pre-tokenizer's split pattern, compiled (PCRE2); a pattern that does not compile names `where`.
  void set_split(const std::string& pattern, const std::string& where);
};

}  // namespace anatomy::io
