// The Lua-visible Tokenizer: userdata holding host/io/bpe.h's BPE (byte-level or
// SentencePiece-style).
// lua/anatomy/data/init.lua wraps it as data.tokenizer(path).
#include <ATen/ATen.h>

#include "bindings/parts.h"
#include "bindings/common.h"
#include "host/io/bpe.h"

namespace anatomy::lua {
namespace {

constexpr const char* kTokenizerMeta = "anatomy.Tokenizer";
using TokenizerPtr = std::shared_ptr<io::BpeTokenizer>;

io::BpeTokenizer& check_tok(lua_State* L) { return *check_userdata<TokenizerPtr>(L, 1, kTokenizerMeta, "Tokenizer"); }

template <typename F>
int load(lua_State* L, F make) {
  try {
    push_userdata<TokenizerPtr>(L, kTokenizerMeta, TokenizerPtr(make()));
  } catch (const io::TokenizerError& e) {
    throw CallError(e.what());
  }
  return 1;
}

// _bpe_from_json(path) -> Tokenizer
int bpe_from_json(lua_State* L) {
  std::string path = check_string(L, 1);
  return load(L, [&] { return io::BpeTokenizer::from_tokenizer_json(path); });
}

// _bpe_from_vocab_merges(vocab.json, merges.txt) -> Tokenizer
int bpe_from_vocab_merges(lua_State* L) {
  std::string vocab = check_string(L, 1), merges = check_string(L, 2);
  return load(L, [&] { return io::BpeTokenizer::from_vocab_merges(vocab, merges); });
}

// _bpe_from_sentencepiece(path, add_bos_token, add_eos_token, add_prefix_space, legacy) -> Tokenizer
int bpe_from_sentencepiece(lua_State* L) {
  std::string path = check_string(L, 1);
  io::BpeTokenizer::SentencePieceSettings s;
  s.add_bos_token = opt_boolean(L, 2, s.add_bos_token);
  s.add_eos_token = opt_boolean(L, 3, s.add_eos_token);
  s.add_prefix_space = opt_boolean(L, 4, s.add_prefix_space);
  s.legacy = opt_boolean(L, 5, s.legacy);
  return load(L, [&] { return io::BpeTokenizer::from_sentencepiece_model(path, s); });
}

// tok:encode(text, add_special_tokens = true) -> int64 ids (1-based)
int tok_encode(lua_State* L) {
  io::BpeTokenizer& t = check_tok(L);
  size_t n = 0;
  if (lua_type(L, 2) != LUA_TSTRING) throw ArgError(2, "string expected, got " + type_name(L, 2));
  const char* s = lua_tolstring(L, 2, &n);
  std::vector<int64_t> ids;
  try {
    ids = t.encode({s, n}, opt_boolean(L, 3, true));
  } catch (const std::invalid_argument& e) {
    throw ArgError(2, e.what());
  }
  push_tensor(L, ids.empty() ? at::empty({0}, at::kLong) : at::tensor(ids, at::kLong));
  return 1;
}

// tok:decode(ids, skip_special_tokens = false) -> text; ids: a tensor or a Lua array, 1-based
int tok_decode(lua_State* L) {
  io::BpeTokenizer& t = check_tok(L);
  std::vector<int64_t> ids = check_token_ids(L, 2);
  try {
    std::string s = t.decode(ids, opt_boolean(L, 3, false));
    lua_pushlstring(L, s.data(), s.size());
  } catch (const std::out_of_range& e) {
    throw ArgError(2, e.what());
  }
  return 1;
}

int tok_vocab_size(lua_State* L) {
  lua_pushnumber(L, static_cast<lua_Number>(check_tok(L).vocab_size()));
  return 1;
}

// tok:id_to_token(id) -> string or nil; tok:token_to_id(s) -> id or nil
int tok_id_to_token(lua_State* L) {
  auto s = check_tok(L).id_to_token(check_integer(L, 2));
  if (s) lua_pushlstring(L, s->data(), s->size()); else lua_pushnil(L);
  return 1;
}
int tok_token_to_id(lua_State* L) {
  auto id = check_tok(L).token_to_id(check_string(L, 2));
  if (id) lua_pushnumber(L, static_cast<lua_Number>(*id)); else lua_pushnil(L);
  return 1;
}

const luaL_Reg tokenizer_methods[] = {
    {"encode", guarded<tok_encode>},
    {"decode", guarded<tok_decode>},
    {"vocab_size", guarded<tok_vocab_size>},
    {"id_to_token", guarded<tok_id_to_token>},
    {"token_to_id", guarded<tok_token_to_id>},
    {nullptr, nullptr},
};

}  // namespace

std::shared_ptr<io::BpeTokenizer> to_bpe_tokenizer(lua_State* L, int idx) {
  void* p = luaL_testudata(L, idx, kTokenizerMeta);
  return p ? *static_cast<TokenizerPtr*>(p) : nullptr;
}

/// Adds _bpe_from_json, _bpe_from_vocab_merges and _bpe_from_sentencepiece to the table at idx (torch._data).
void register_tokenizer(lua_State* L, int data) {
  define_userdata<TokenizerPtr>(L, kTokenizerMeta, "Tokenizer", tokenizer_methods);
  lua_pushcfunction(L, guarded<bpe_from_json>);
  lua_setfield(L, data, "_bpe_from_json");
  lua_pushcfunction(L, guarded<bpe_from_vocab_merges>);
  lua_setfield(L, data, "_bpe_from_vocab_merges");
  lua_pushcfunction(L, guarded<bpe_from_sentencepiece>);
  lua_setfield(L, data, "_bpe_from_sentencepiece");
}

}  // namespace anatomy::lua
