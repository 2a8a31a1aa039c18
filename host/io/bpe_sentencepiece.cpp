// BpeTokenizer::from_sentencepiece_model (see bpe.h): a SentencePiece
// tokenizer.model read with a small protocol-buffer reader of its own, then
// turned into the SentencePiece-style BPE transformers 5 builds from it.
#include "host/io/bpe.h"
#include "host/io/bpe_text.h"

#include <cstdint>
#include <optional>

namespace anatomy::io {

using bpe_text::kSpace;
using bpe_text::read_file;
using bpe_text::utf8_chars;

namespace {
// A protocol-buffer message read field by field (the wire format: a varint
// key = field number << 3 | wire type, then a varint, 8 or 4 bytes, or a
// length and that many bytes). Every length is checked against what is left.
struct ProtoReader {
  const unsigned char* p;
  const unsigned char* end;
  const std::string& where;
  [[noreturn]] void corrupt(const std::string& what) const {
    throw TokenizerError("'" + where + "' is not a SentencePiece model: " + what);
  }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p >= end) corrupt("a number runs past the end");
      unsigned char b = *p++;
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    corrupt("a number longer than 10 bytes");
  }
  // The next field: its number, wire type, and (length-delimited) its bytes.
  bool next(uint32_t& field, uint32_t& wire, std::string_view& bytes, uint64_t& number) {
    if (p >= end) return false;
    uint64_t key = varint();
    field = static_cast<uint32_t>(key >> 3);
    wire = static_cast<uint32_t>(key & 7);
    if (wire == 0) {
      number = varint();
    } else if (wire == 1 || wire == 5) {
      size_t n = wire == 1 ? 8 : 4;
      if (static_cast<size_t>(end - p) < n) corrupt("a fixed-size field runs past the end");
      number = 0;
      for (size_t i = 0; i < n; ++i) number |= static_cast<uint64_t>(p[i]) << (8 * i);
      p += n;
    } else if (wire == 2) {
      uint64_t n = varint();
      if (n > static_cast<uint64_t>(end - p)) corrupt("a field of " + std::to_string(n) + " bytes runs past the end");
      bytes = std::string_view(reinterpret_cast<const char*>(p), static_cast<size_t>(n));
      p += n;
    } else {
      corrupt("wire type " + std::to_string(wire) + " (groups or an unknown type)");
    }
    return true;
  }
};
}  // namespace

std::unique_ptr<BpeTokenizer> BpeTokenizer::from_sentencepiece_model(const std::string& path, const SentencePieceSettings& settings) {
  std::string file = read_file(path);
  enum : int { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };
  struct Piece {
    std::string text;
    int type = kNormal;
  };
  std::vector<Piece> pieces;
  int model_type = 1;  // TrainerSpec.model_type: UNIGRAM = 1 (the default), BPE = 2
  ProtoReader top{reinterpret_cast<const unsigned char*>(file.data()), reinterpret_cast<const unsigned char*>(file.data()) + file.size(), path};
  uint32_t field = 0, wire = 0;
  std::string_view bytes;
  uint64_t number = 0;
  while (top.next(field, wire, bytes, number)) {
    if (field == 1 && wire == 2) {  // ModelProto.pieces
      ProtoReader r{reinterpret_cast<const unsigned char*>(bytes.data()), reinterpret_cast<const unsigned char*>(bytes.data()) + bytes.size(), path};
      Piece piece;
      while (r.next(field, wire, bytes, number)) {
        if (field == 1 && wire == 2) piece.text = std::string(bytes);
        else if (field == 3 && wire == 0) piece.type = static_cast<int>(number);
      }
      pieces.push_back(std::move(piece));
    } else if (field == 2 && wire == 2) {  // ModelProto.trainer_spec
      ProtoReader r{reinterpret_cast<const unsigned char*>(bytes.data()), reinterpret_cast<const unsigned char*>(bytes.data()) + bytes.size(), path};
      while (r.next(field, wire, bytes, number))
        if (field == 3 && wire == 0) model_type = static_cast<int>(number);
    }
  }
  if (pieces.empty()) top.corrupt("it has no pieces");
  if (model_type != 2)
    throw TokenizerError("'" + path + "': trainer_spec.model_type is " +
                         (model_type == 1 ? std::string("UNIGRAM") : std::to_string(model_type)) +
                         "; only BPE SentencePiece models (Llama, Mistral) are supported");

  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer());
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].text.empty()) top.corrupt("piece " + std::to_string(i) + " is empty");
    t->vocab_.emplace(pieces[i].text, static_cast<int64_t>(i));
  }
  // Merges as transformers' generate_merges makes them: every split of every
  // piece into two pieces, ordered by the merged piece's id, then by the
  // length (in characters) of its left part.
  for (size_t i = 0; i < pieces.size(); ++i) {
    std::vector<std::string> chars = utf8_chars(pieces[i].text);
    std::string left;
    for (size_t k = 1; k < chars.size(); ++k) {
      left += chars[k - 1];
      std::string right = pieces[i].text.substr(left.size());
      if (t->vocab_.count(left) && t->vocab_.count(right))
        t->merge_rank_.emplace(left + " " + right, static_cast<int>(t->merge_rank_.size()));
    }
  }
  t->byte_level_ = false;
  t->byte_fallback_ = true;
  t->fuse_unk_ = true;  // and no unk_token: what neither the vocabulary nor the bytes spell is dropped, as there
  t->space_ = kSpace;
  t->prepend_ = !settings.add_prefix_space ? Prepend::never : settings.legacy ? Prepend::always : Prepend::first;
  t->prepend_if_missing_ = true;
  t->split_at_space_ = false;
  using Kind = DecodeStep::Kind;
  t->decoder_ = {{Kind::replace, kSpace, " ", 0, 0}, {Kind::byte_fallback, "", "", 0, 0}, {Kind::fuse, "", "", 0, 0}};
  if (settings.add_prefix_space) t->decoder_.push_back({Kind::strip, " ", "", 1, 0});
  std::optional<int64_t> bos, eos;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& piece = pieces[i];
    if (piece.type == kUnknown || piece.type == kControl || piece.type == kUserDefined)
      t->added_.push_back({piece.text, static_cast<int64_t>(i), piece.type != kUserDefined, false, false});
    if (piece.type == kControl && piece.text == "<s>") bos = static_cast<int64_t>(i);
    if (piece.type == kControl && piece.text == "</s>") eos = static_cast<int64_t>(i);
  }
  if (settings.add_bos_token) {
    if (!bos) throw TokenizerError("'" + path + "': add_bos_token is true but the model has no <s> piece");
    t->prefix_.push_back(*bos + 1);
  }
  if (settings.add_eos_token) {
    if (!eos) throw TokenizerError("'" + path + "': add_eos_token is true but the model has no </s> piece");
    t->suffix_.push_back(*eos + 1);
  }
  t->finish_loading(path);
  return t;
}

}  // namespace anatomy::io
