// libFuzzer: a SentencePiece tokenizer.model (host/io/bpe.cpp's protobuf
// reader and the merges it derives), loaded, then a text encoded and decoded.
#include "host/io/bpe.h"
#include "tests/fuzz/fuzz_common.h"

#include <stdexcept>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string path = anatomy::fuzz::as_file(data, size, ".model");
  anatomy::io::BpeTokenizer::SentencePieceSettings settings;
  settings.add_bos_token = size % 2 == 0;
  settings.legacy = size % 3 == 0;
  try {
    auto tok = anatomy::io::BpeTokenizer::from_sentencepiece_model(path, settings);
    auto ids = tok->encode("Hello  world!\n<s> caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x91\x8b", true);
    tok->decode(ids, false);
  } catch (const anatomy::io::TokenizerError& e) {
    anatomy::fuzz::require_message(e.what());
  } catch (const std::invalid_argument& e) {
    anatomy::fuzz::require_message(e.what());
  }
  return 0;
}
