// libFuzzer: the YAML reader (host/io/yaml.cpp over yaml-cpp): scalars by the
// core schema, anchors and aliases, the depth and node bounds, tags.
#include "host/io/yaml.h"
#include "tests/fuzz/fuzz_common.h"

#include <cstdlib>
#include <set>

namespace {
// Every node reachable, each once (an alias shares its anchor's node: a
// billion laughs is a few nodes, not 9^12), none deeper than the bound, no
// key null or missing, and no node its own descendant.
void walk(const anatomy::io::YamlValue& v, int depth, std::set<const anatomy::io::YamlValue*>& seen,
          std::set<const anatomy::io::YamlValue*>& open) {
  if (depth > anatomy::io::kMaxYamlDepth + 1) std::abort();
  if (open.count(&v)) std::abort();
  if (!seen.insert(&v).second) return;
  open.insert(&v);
  for (const auto& item : v.items) walk(*item, depth + 1, seen, open);
  for (const auto& [k, value] : v.entries) {
    if (!k || k->kind == anatomy::io::YamlValue::Kind::null) std::abort();
    walk(*value, depth + 1, seen, open);
  }
  open.erase(&v);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    // a small node bound, so that aliases cannot make the walk long
    anatomy::io::YamlPtr v = anatomy::io::parse_yaml(std::string(reinterpret_cast<const char*>(data), size), "fuzz.yaml", 4096);
    std::set<const anatomy::io::YamlValue*> seen, open;
    if (v) walk(*v, 0, seen, open);
  } catch (const anatomy::io::YamlError& e) {
    anatomy::fuzz::require_message(e.what());
  }
  return 0;
}
