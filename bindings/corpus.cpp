// The Lua-visible Corpus: userdata holding a tokenized text (host/io/corpus.h).
// lua/anatomy/data/init.lua wraps it as data.text(...).
#include <ATen/ATen.h>

#include "bindings/parts.h"
#include "bindings/common.h"
#include "host/io/corpus.h"
#include "host/io/bpe.h"
#include "host/io/digest.h"

namespace anatomy::lua {
namespace {

constexpr const char* kCorpusMeta = "anatomy.Corpus";
using CorpusPtr = std::shared_ptr<io::Corpus>;

io::Corpus& check_corpus(lua_State* L, int idx) {
  return *check_userdata<CorpusPtr>(L, idx, kCorpusMeta, "Corpus");
}

void push_corpus(lua_State* L, std::unique_ptr<io::Corpus> c) { push_userdata<CorpusPtr>(L, kCorpusMeta, std::move(c)); }

double split_fraction(lua_State* L, int idx) {
  double f = lua_isnoneornil(L, idx) ? 0.9 : check_number(L, idx);
  if (!(f > 0 && f <= 1)) throw ArgError(idx, "split must be a fraction in (0, 1], got " + std::to_string(f));
  return f;
}

// text(path, tokenizer, split, vocab_size, type, model)
int data_text(lua_State* L) {
  std::string path = check_string(L, 1);
  if (auto bpe = to_bpe_tokenizer(L, 2)) {  // a pretrained model's tokenizer (data.tokenizer)
    double fraction = split_fraction(L, 3);
    try {
      push_corpus(L, io::load_text_corpus(path, io::BpeTokenizer::for_corpus(bpe), fraction));
    } catch (const std::runtime_error& e) {
      throw CallError(e.what());
    } catch (const std::invalid_argument& e) {
      throw CallError(e.what());
    }
    return 1;
  }
  io::TokenizerSpec spec;
  if (!lua_isnoneornil(L, 2)) spec.kind = check_string(L, 2);
  if (spec.kind != "char" && spec.kind != "byte" && spec.kind != "sentencepiece")
    throw ArgError(2, "unknown tokenizer '" + spec.kind + "', expected char, byte or sentencepiece");
  double fraction = split_fraction(L, 3);
  if (!lua_isnoneornil(L, 4)) spec.vocab_size = check_integer(L, 4);
  if (spec.vocab_size < 2) throw ArgError(4, "vocab_size must be at least 2");
  if (!lua_isnoneornil(L, 5)) spec.type = check_string(L, 5);
  if (!lua_isnoneornil(L, 6)) spec.model = check_string(L, 6);
  try {
    push_corpus(L, io::load_text_corpus(path, spec, fraction));
  } catch (const std::runtime_error& e) {
    throw CallError(e.what());
  }
  return 1;
}

// from_string(text, tokenizer, split)
int data_from_string(lua_State* L) {
  std::string text = check_string(L, 1);
  std::string tok = lua_isnoneornil(L, 2) ? "char" : check_string(L, 2);
  if (tok != "char" && tok != "byte") throw ArgError(2, "unknown tokenizer '" + tok + "', expected char or byte");
  push_corpus(L, io::make_text_corpus(text, tok, split_fraction(L, 3)));
  return 1;
}

// c:batch(B, T, split) -> inputs (B, T), targets (B, T)
int corpus_batch(lua_State* L) {
  io::Corpus& c = check_corpus(L, 1);
  int64_t B = check_integer(L, 2), T = check_integer(L, 3);
  if (B < 1) throw ArgError(2, "batch size must be positive, got " + std::to_string(B));
  if (T < 1) throw ArgError(3, "sequence length must be positive, got " + std::to_string(T));
  std::string split = lua_isnoneornil(L, 4) ? "train" : check_string(L, 4);
  if (split != "train" && split != "val") throw ArgError(4, "split must be 'train' or 'val', got '" + split + "'");
  try {
    auto [x, y] = c.batch(B, T, split);
    push_tensor(L, x);
    push_tensor(L, y);
  } catch (const std::invalid_argument& e) {
    throw ArgError(3, e.what());
  }
  return 2;
}

int corpus_encode(lua_State* L) {
  io::Corpus& c = check_corpus(L, 1);
  std::string text = check_string(L, 2);
  try {
    std::vector<int64_t> ids = c.tokenizer().encode(text);
    push_tensor(L, ids.empty() ? at::empty({0}, at::kLong) : at::tensor(ids, at::kLong));
  } catch (const std::invalid_argument& e) {
    throw ArgError(2, e.what());
  }
  return 1;
}

// c:decode(ids): a tensor of any shape (flattened) or a Lua array of ids
int corpus_decode(lua_State* L) {
  io::Corpus& c = check_corpus(L, 1);
  std::vector<int64_t> ids = check_token_ids(L, 2);
  try {
    std::string s = c.tokenizer().decode(ids);
    lua_pushlstring(L, s.data(), s.size());
  } catch (const std::out_of_range& e) {
    throw ArgError(2, e.what());
  }
  return 1;
}

int corpus_vocab_size(lua_State* L) {
  lua_pushnumber(L, static_cast<lua_Number>(check_corpus(L, 1).tokenizer().vocab_size()));
  return 1;
}

int corpus_tokenizer(lua_State* L) {
  lua_pushstring(L, check_corpus(L, 1).tokenizer().kind().c_str());
  return 1;
}

// c:tokens(split = nil) -> all ids, or one split's
int corpus_tokens(lua_State* L) {
  io::Corpus& c = check_corpus(L, 1);
  if (lua_isnoneornil(L, 2)) {
    push_tensor(L, c.tokens());
    return 1;
  }
  std::string split = check_string(L, 2);
  if (split != "train" && split != "val") throw ArgError(2, "split must be 'train' or 'val', got '" + split + "'");
  push_tensor(L, c.split(split));
  return 1;
}

// file_info(path) -> {path = absolute path, bytes = size, sha256 = hex digest}
int data_file_info(lua_State* L) {
  std::string path = check_string(L, 1);
  io::FileInfo info;
  try {
    info = io::file_info(path);
  } catch (const std::runtime_error& e) {
    throw CallError(e.what());
  }
  lua_createtable(L, 0, 3);
  lua_pushlstring(L, info.path.data(), info.path.size());
  lua_setfield(L, -2, "path");
  lua_pushnumber(L, static_cast<lua_Number>(info.bytes));
  lua_setfield(L, -2, "bytes");
  lua_pushlstring(L, info.sha256.data(), info.sha256.size());
  lua_setfield(L, -2, "sha256");
  return 1;
}

// sha256(s) -> the SHA-256 of a Lua string's bytes, as hex
int data_sha256(lua_State* L) {
  size_t n = 0;
  if (lua_type(L, 1) != LUA_TSTRING) throw ArgError(1, "string expected, got " + type_name(L, 1));
  const char* s = lua_tolstring(L, 1, &n);
  std::string hex = io::sha256_hex({s, n});
  lua_pushlstring(L, hex.data(), hex.size());
  return 1;
}

// realpath(path) -> the absolute path of an existing file or folder, or nil and the reason
int data_realpath(lua_State* L) {
  std::string path = check_string(L, 1);
  try {
    std::string resolved = io::real_path(path);
    lua_pushlstring(L, resolved.data(), resolved.size());
    return 1;
  } catch (const std::runtime_error& e) {
    lua_pushnil(L);
    lua_pushstring(L, e.what());
    return 2;
  }
}

const luaL_Reg corpus_methods[] = {
    {"batch", guarded<corpus_batch>},
    {"encode", guarded<corpus_encode>},
    {"decode", guarded<corpus_decode>},
    {"vocab_size", guarded<corpus_vocab_size>},
    {"tokenizer", guarded<corpus_tokenizer>},
    {"tokens", guarded<corpus_tokens>},
    {nullptr, nullptr},
};

const luaL_Reg data_functions[] = {
    {"text", guarded<data_text>},
    {"from_string", guarded<data_from_string>},
    {"file_info", guarded<data_file_info>},
    {"sha256", guarded<data_sha256>},
    {"realpath", guarded<data_realpath>},
    {nullptr, nullptr},
};

}  // namespace

// Pushes the table of corpus constructors (torch._data).
int luaopen_anatomy_corpus(lua_State* L) {
  define_userdata<CorpusPtr>(L, kCorpusMeta, "Corpus", corpus_methods);
  lua_newtable(L);
  luaL_register(L, nullptr, data_functions);
  register_tokenizer(L, lua_gettop(L));
  return 1;
}

}  // namespace anatomy::lua
