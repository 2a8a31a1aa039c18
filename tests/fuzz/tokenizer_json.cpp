// libFuzzer: a Hugging Face tokenizer.json (host/io/bpe.cpp), loaded, then a
// text with Unicode, whitespace runs and special-looking tokens encoded and
// decoded back.
#include "host/io/bpe.h"
#include "tests/fuzz/fuzz_common.h"

#include <stdexcept>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string path = anatomy::fuzz::as_file(data, size, ".json");
  try {
    auto tok = anatomy::io::BpeTokenizer::from_tokenizer_json(path);
    auto ids = tok->encode("Hello  world!\n<s> caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x91\x8b 12345 <|endoftext|>", true);
    tok->decode(ids, false);
    tok->decode(ids, true);
  } catch (const anatomy::io::TokenizerError& e) {
    anatomy::fuzz::require_message(e.what());
  } catch (const std::invalid_argument& e) {  // encode: a piece outside the vocabulary without an unk_token
    anatomy::fuzz::require_message(e.what());
  }
  return 0;
}
