// YAML documents as a tree of plain values, read with yaml-cpp's event
// parser: SAELens's release registry (pretrained_saes.yaml) is YAML. Plain
// scalars resolve as YAML 1.2's core schema says (null, true/false, integers
// in decimal, 0o octal and 0x hex, floats with .inf and .nan, else strings);
// quoted and block scalars are strings. Nesting and anchors are bounded so
// that a hostile file is an error, never a stack overflow or an expansion.
#pragma once
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace anatomy::io {

/// A document that cannot be read; the message names the source, the line and
/// the column (both from 1).
struct YamlError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct YamlValue;
using YamlPtr = std::shared_ptr<const YamlValue>;

/// One node. An alias is the node its anchor named, shared (as PyYAML gives
/// the same object twice), so a document's size bounds the tree's.
struct YamlValue {
  enum class Kind { null, boolean, number, string, sequence, map };
  Kind kind = Kind::null;
  bool boolean = false;
  double number = 0;                               ///< integers only where a double holds them exactly
  std::string string;
  std::vector<YamlPtr> items;                      ///< a sequence's
  std::vector<std::pair<YamlPtr, YamlPtr>> entries;  ///< a map's, in file order; keys are scalars, not null
  int line = 0, column = 0;                        ///< where the node starts (from 1)
};

/// The deepest nesting of sequences and maps a document may have.
constexpr int kMaxYamlDepth = 256;
/// The most nodes a document may have: about 150 bytes each in the tree, and
/// '[1,1,...]' makes one of every 2 bytes, so memory is bounded by this and
/// not by the text's size (SAELens's registry has 145 thousand).
constexpr int64_t kMaxYamlNodes = int64_t(1) << 23;

/// Parses one document (empty text: a null). `source` names it in errors
/// (a file's path). Refused: a second document, nesting past kMaxYamlDepth,
/// more than max_nodes nodes,
/// a key that is a sequence, a map or null, a key given twice in a map, an
/// alias to a node that contains it, a tag other than YAML's own
/// (!!str, !!int, !!float, !!bool, !!null, !!seq, !!map), an integer that a
/// double does not hold exactly (beyond 2^53), and what yaml-cpp refuses.
YamlPtr parse_yaml(const std::string& text, const std::string& source, int64_t max_nodes = kMaxYamlNodes);

}  // namespace anatomy::io
