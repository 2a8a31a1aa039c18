// Corpora, tokenizers and file digests in C++, without Lua.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "host/io/corpus.h"
#include "host/io/digest.h"

using namespace anatomy::io;

TEST_CASE("char tokenizer: UTF-8 characters, 1-based ids, round trip") {
  auto tok = make_char_tokenizer("héllo ✓");
  CHECK(tok->vocab_size() == 6);  // h, é, l, o, space, ✓
  auto ids = tok->encode("héllo ✓");
  CHECK(tok->decode(ids) == "héllo ✓");
  for (int64_t id : ids) CHECK((id >= 1 && id <= tok->vocab_size()));
  CHECK_THROWS_AS(tok->encode("z"), std::invalid_argument);
}

TEST_CASE("byte tokenizer: 256 ids, byte b is id b + 1") {
  auto tok = make_byte_tokenizer();
  CHECK(tok->vocab_size() == 256);
  CHECK(tok->encode("A") == std::vector<int64_t>{66});
  CHECK(tok->decode({66, 67}) == "AB");
}

TEST_CASE("a corpus splits its tokens and hands out shifted windows") {
  std::string text;
  for (int i = 0; i < 50; ++i) text += "abcdefghij";
  auto c = make_text_corpus(text, "char", 0.9);
  CHECK(c->split("train").numel() + c->split("val").numel() == c->tokens().numel());
  at::manual_seed(0);
  auto [x, y] = c->batch(4, 8, "train");
  REQUIRE(x.sizes() == at::IntArrayRef({4, 8}));
  // the targets are the inputs one token later: in "abc...j" each id is the previous + 1, wrapping at 10
  at::Tensor next = (x % 10) + 1;
  CHECK(at::equal(y, next));
}

TEST_CASE("SHA-256 and file facts") {
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  char path[] = "/tmp/anatomy_digest_XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  close(fd);
  { std::ofstream(path, std::ios::binary) << std::string(3 << 20, 'x'); }
  FileInfo info = file_info(path);
  CHECK(info.bytes == (3 << 20));
  CHECK(info.sha256 == sha256_hex(std::string(3 << 20, 'x')));
  CHECK(info.path == path);
  std::remove(path);
  CHECK_THROWS_WITH(file_info("/no/such/file"), "cannot resolve '/no/such/file': No such file or directory");
}
