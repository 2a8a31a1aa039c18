// What the BPE files share (bpe.cpp, bpe_json.cpp, bpe_sentencepiece.cpp;
// not part of the tokenizer's interface): reading a file whole, UTF-8 in and
// out, SentencePiece's space. Defined in bpe_text.cpp.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace anatomy::io::bpe_text {

/// SentencePiece's stand-in for a space, U+2581.
inline constexpr const char* kSpace = "\xE2\x96\x81";
/// The file's bytes, or TokenizerError naming it.
std::string read_file(const std::string& path);
/// UTF-8 text split into its characters (as strings); invalid bytes stand alone.
std::vector<std::string> utf8_chars(std::string_view s);
/// Appends code point cp (below U+10000) as UTF-8.
void append_utf8(std::string& out, uint32_t cp);
/// The code point of one UTF-8 character (as utf8_chars splits them).
uint32_t decode_utf8(const std::string& c);
/// The bytes as UTF-8, each maximal invalid subsequence replaced by U+FFFD.
std::string valid_utf8(const std::string& s);

}  // namespace anatomy::io::bpe_text
