// What host/io/bpe.cpp and host/io/bpe_sentencepiece.cpp share (not part of
// the tokenizer's interface): reading a file whole, splitting UTF-8 into
// characters, SentencePiece's space.
#pragma once
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

}  // namespace anatomy::io::bpe_text
