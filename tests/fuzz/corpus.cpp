// libFuzzer: the text corpus loaders (host/io/corpus.cpp): the input as a
// text file read through the memory map and tokenized by characters (UTF-8
// code points; the vocabulary is the text's own) and by bytes, then decoded
// back, split, and batched. A text that loads must round-trip exactly.
#include <ATen/ATen.h>

#include "host/io/corpus.h"
#include "tests/fuzz/fuzz_common.h"

#include <stdexcept>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string path = anatomy::fuzz::as_file(data, size, ".txt");
  std::string_view text(reinterpret_cast<const char*>(data), size);
  for (const char* kind : {"char", "byte"}) {
    anatomy::io::TokenizerSpec spec;
    spec.kind = kind;
    double fraction = size == 0 ? 1.0 : (1 + data[0] % 10) / 10.0;
    try {
      auto corpus = anatomy::io::load_text_corpus(path, spec, fraction);
      at::Tensor ids = corpus->tokens();
      std::vector<int64_t> v(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
      if (corpus->tokenizer().decode(v) != text) std::abort();  // a loaded text round-trips
      for (int64_t id : v)
        if (id < 1 || id > corpus->tokenizer().vocab_size()) std::abort();
      int64_t T = 1 + static_cast<int64_t>(size % 7);
      if (corpus->split("train").numel() > T) corpus->batch(2, T, "train");
    } catch (const std::invalid_argument& e) {
      anatomy::fuzz::require_message(e.what());
    } catch (const std::runtime_error& e) {
      anatomy::fuzz::require_message(e.what());
    }
  }
  return 0;
}
