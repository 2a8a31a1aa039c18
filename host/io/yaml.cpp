// YAML reading (see yaml.h): yaml-cpp's parser sends events (a scalar, the
// start or end of a sequence or map, an alias); Builder turns them into a
// YamlValue tree, resolving plain scalars by YAML 1.2's core schema (the
// regular expressions of its section 10.3.2, written out by hand here).
#include "host/io/yaml.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/exceptions.h>
#include <yaml-cpp/mark.h>
#include <yaml-cpp/parser.h>

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <sstream>

namespace anatomy::io {
namespace {

using Kind = YamlValue::Kind;
const std::string kTag = "tag:yaml.org,2002:";

// An error at a mark, thrown from inside the event handler.
struct MarkedError {
  YAML::Mark mark;
  std::string why;
};

bool digits(const std::string& s, size_t from, size_t to, int base) {
  if (from >= to) return false;
  for (size_t i = from; i < to; ++i) {
    char c = s[i];
    bool ok = base == 8    ? (c >= '0' && c <= '7')
              : base == 10 ? (c >= '0' && c <= '9')
                           : std::isxdigit(static_cast<unsigned char>(c)) != 0;
    if (!ok) return false;
  }
  return true;
}

// An integer of the core schema ([-+]?[0-9]+, 0o[0-7]+, 0x[0-9a-fA-F]+):
// true and its value, or false when s is not one. Magnitudes past 2^53 are
// an error: a double would hold a neighbour instead.
bool core_int(const std::string& s, double& out, const YAML::Mark& mark) {
  int base = 10;
  size_t start = 0;
  bool negative = false;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'o' || s[1] == 'x')) {
    base = s[1] == 'o' ? 8 : 16;
    start = 2;
  } else if (!s.empty() && (s[0] == '-' || s[0] == '+')) {
    negative = s[0] == '-';
    start = 1;
  }
  if (!digits(s, start, s.size(), base)) return false;
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data() + start, s.data() + s.size(), v, base);
  if (ec != std::errc() || end != s.data() + s.size() || v > (uint64_t(1) << 53))
    throw MarkedError{mark, "the integer " + s + " is beyond 2^53, where a Lua number would hold another value"};
  out = negative ? -static_cast<double>(v) : static_cast<double>(v);
  return true;
}

// A float of the core schema: [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?,
// [-+]?\.(inf|Inf|INF), \.(nan|NaN|NAN).
bool core_float(const std::string& s, double& out) {
  size_t i = 0;
  bool negative = false;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) negative = s[i++] == '-';
  std::string rest = s.substr(i);
  if (rest == ".inf" || rest == ".Inf" || rest == ".INF") {
    out = negative ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
    return true;
  }
  if (s == ".nan" || s == ".NaN" || s == ".NAN") {
    out = std::numeric_limits<double>::quiet_NaN();
    return true;
  }
  size_t j = i, int_digits = 0, frac_digits = 0;
  while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j, ++int_digits;
  if (j < s.size() && s[j] == '.') {
    ++j;
    while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j, ++frac_digits;
  }
  if (int_digits == 0 && frac_digits == 0) return false;
  if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
    ++j;
    if (j < s.size() && (s[j] == '-' || s[j] == '+')) ++j;
    size_t k = j;
    while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
    if (j == k) return false;
  }
  if (j != s.size()) return false;
  // from_chars reads the C locale's form whatever the process's locale is;
  // it takes no '+' sign, which the schema allows
  const char* first = s.data() + (s[0] == '+' ? 1 : 0);
  auto [end, ec] = std::from_chars(first, s.data() + s.size(), out);
  if (ec == std::errc::result_out_of_range) out = std::strtod(first, nullptr);  // an overflow is ±inf, an underflow 0
  else if (ec != std::errc() || end != s.data() + s.size()) return false;
  return true;
}

bool core_bool(const std::string& s, bool& out) {
  if (s == "true" || s == "True" || s == "TRUE") return out = true, true;
  if (s == "false" || s == "False" || s == "FALSE") return out = false, true;
  return false;
}

bool core_null(const std::string& s) { return s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL"; }

// Whether the quoted scalar starting at text[pos] has its closing quote:
// yaml-cpp takes an unterminated one to the end of the input as its value.
bool closed_quote(const std::string& text, size_t pos) {
  const char q = text[pos];
  for (size_t i = pos + 1; i < text.size(); ++i) {
    if (q == '"' && text[i] == '\\') ++i;
    else if (text[i] == q) {
      if (q == '\'' && i + 1 < text.size() && text[i + 1] == '\'') ++i;  // '' is a quote inside
      else return true;
    }
  }
  return false;
}

class Builder : public YAML::EventHandler {
 public:
  Builder(const std::string& text, int64_t max_nodes) : text_(text), max_nodes_(max_nodes) {}
  YamlPtr root;
  bool done = false;

  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}

  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    auto v = make(mark, Kind::null);
    add(v, anchor);
  }

  void OnAlias(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    if (open_anchors_.count(anchor)) throw MarkedError{mark, "an alias refers to a node that contains it"};
    auto it = anchors_.find(anchor);
    if (it == anchors_.end()) throw MarkedError{mark, "an alias refers to no anchor"};
    add(it->second, YAML::NullAnchor, &mark);
  }

  void OnScalar(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor, const std::string& value) override {
    auto v = make(mark, Kind::string);
    if (tag != "?" && mark.pos >= 0 && static_cast<size_t>(mark.pos) < text_.size() &&
        (text_[mark.pos] == '\'' || text_[mark.pos] == '"') && !closed_quote(text_, static_cast<size_t>(mark.pos)))
      throw MarkedError{mark, "a quoted string is not closed"};
    if (tag == "?") {  // plain: the core schema decides
      if (core_null(value)) v->kind = Kind::null;
      else if (core_bool(value, v->boolean)) v->kind = Kind::boolean;
      else if (core_int(value, v->number, mark) || core_float(value, v->number)) v->kind = Kind::number;
      else v->string = value;
    } else if (tag == "!" || tag == kTag + "str") {
      v->string = value;
    } else if (tag == kTag + "int") {
      if (!core_int(value, v->number, mark)) throw MarkedError{mark, "'" + value + "' is tagged !!int but is not an integer"};
      v->kind = Kind::number;
    } else if (tag == kTag + "float") {
      if (!core_int(value, v->number, mark) && !core_float(value, v->number))
        throw MarkedError{mark, "'" + value + "' is tagged !!float but is not a number"};
      v->kind = Kind::number;
    } else if (tag == kTag + "bool") {
      if (!core_bool(value, v->boolean)) throw MarkedError{mark, "'" + value + "' is tagged !!bool but is neither true nor false"};
      v->kind = Kind::boolean;
    } else if (tag == kTag + "null") {
      if (!core_null(value)) throw MarkedError{mark, "'" + value + "' is tagged !!null but is not null"};
      v->kind = Kind::null;
    } else {
      throw MarkedError{mark, "the tag '" + tag + "' is not one of YAML's own (!!str, !!int, !!float, !!bool, !!null)"};
    }
    add(v, anchor);
  }

  void OnSequenceStart(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    open(mark, tag, kTag + "seq", Kind::sequence, anchor);
  }
  void OnSequenceEnd() override { close(); }
  void OnMapStart(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor, YAML::EmitterStyle::value) override {
    open(mark, tag, kTag + "map", Kind::map, anchor);
  }
  void OnMapEnd() override { close(); }

 private:
  struct Frame {
    std::shared_ptr<YamlValue> node;
    YAML::anchor_t anchor;
    YamlPtr key;                                    // a map's key awaiting its value
    std::map<std::string, std::pair<int, int>> keys;  // a map's keys so far, and where each was
  };
  const std::string& text_;
  std::vector<Frame> stack_;
  std::map<YAML::anchor_t, YamlPtr> anchors_;
  std::set<YAML::anchor_t> open_anchors_;

  const int64_t max_nodes_;
  int64_t nodes_ = 0;

  std::shared_ptr<YamlValue> make(const YAML::Mark& mark, Kind kind) {
    if (++nodes_ > max_nodes_) throw MarkedError{mark, "the document has more than " + std::to_string(max_nodes_) + " nodes"};
    auto v = std::make_shared<YamlValue>();
    v->kind = kind;
    v->line = mark.line + 1;
    v->column = mark.column + 1;
    return v;
  }

  void open(const YAML::Mark& mark, const std::string& tag, const std::string& own, Kind kind, YAML::anchor_t anchor) {
    if (tag != "?" && tag != "!" && tag != own)
      throw MarkedError{mark, "the tag '" + tag + "' is not one of YAML's own (!!seq, !!map)"};
    if (static_cast<int>(stack_.size()) >= kMaxYamlDepth)
      throw MarkedError{mark, "sequences and maps nest deeper than " + std::to_string(kMaxYamlDepth) + " levels"};
    stack_.push_back({make(mark, kind), anchor, nullptr, {}});
    if (anchor != YAML::NullAnchor) open_anchors_.insert(anchor);
  }

  void close() {
    Frame f = std::move(stack_.back());
    stack_.pop_back();
    if (f.anchor != YAML::NullAnchor) open_anchors_.erase(f.anchor);
    add(f.node, f.anchor);
  }

  // A key's identity as a Lua table sees it (1 and 1.0 are one key).
  static std::string key_id(const YamlValue& k) {
    if (k.kind == Kind::boolean) return k.boolean ? "true" : "false";
    if (k.kind == Kind::string) return "'" + k.string + "'";
    std::ostringstream s;
    s.precision(17);
    s << (k.number == 0 ? 0.0 : k.number);
    return s.str();
  }

  void add(YamlPtr v, YAML::anchor_t anchor, const YAML::Mark* at = nullptr) {
    if (anchor != YAML::NullAnchor) anchors_[anchor] = v;
    if (stack_.empty()) {
      root = std::move(v);
      return;
    }
    Frame& f = stack_.back();
    if (f.node->kind == Kind::sequence) {
      f.node->items.push_back(std::move(v));
      return;
    }
    if (f.key) {
      f.node->entries.emplace_back(std::move(f.key), std::move(v));
      f.key = nullptr;
      return;
    }
    YAML::Mark mark;
    if (at) mark = *at;
    else mark.line = v->line - 1, mark.column = v->column - 1;
    if (v->kind == Kind::null) throw MarkedError{mark, "a key is null"};
    if (v->kind == Kind::sequence || v->kind == Kind::map) throw MarkedError{mark, "a key is a sequence or a map"};
    if (v->kind == Kind::number && std::isnan(v->number)) throw MarkedError{mark, "a key is .nan"};
    auto [it, fresh] = f.keys.emplace(key_id(*v), std::make_pair(mark.line + 1, mark.column + 1));
    if (!fresh)
      throw MarkedError{mark, "the key " + key_id(*v) + " appears twice in a map (first at line " +
                                  std::to_string(it->second.first) + ", column " + std::to_string(it->second.second) + ")"};
    f.key = std::move(v);
  }
};

// Refuses any second document.
class NoMore : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override { throw MarkedError{mark, "a second document (one is read)"}; }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& m, YAML::anchor_t) override { OnDocumentStart(m); }
  void OnAlias(const YAML::Mark& m, YAML::anchor_t) override { OnDocumentStart(m); }
  void OnScalar(const YAML::Mark& m, const std::string&, YAML::anchor_t, const std::string&) override { OnDocumentStart(m); }
  void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    OnDocumentStart(m);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    OnDocumentStart(m);
  }
  void OnMapEnd() override {}
};

[[noreturn]] void fail(const std::string& source, const YAML::Mark& mark, const std::string& why) {
  if (mark.is_null()) throw YamlError(source + ": " + why);
  throw YamlError(source + ": line " + std::to_string(mark.line + 1) + ", column " + std::to_string(mark.column + 1) + ": " + why);
}

}  // namespace

YamlPtr parse_yaml(const std::string& text, const std::string& source, int64_t max_nodes) {
  std::istringstream in(text);
  Builder builder(text, max_nodes);
  try {
    YAML::Parser parser(in);
    if (!parser.HandleNextDocument(builder)) return std::make_shared<YamlValue>();  // empty: null
    NoMore rest;
    parser.HandleNextDocument(rest);
  } catch (const MarkedError& e) {
    fail(source, e.mark, e.why);
  } catch (const YAML::Exception& e) {
    fail(source, e.mark, e.msg);
  }
  return builder.root ? builder.root : std::make_shared<YamlValue>();
}

}  // namespace anatomy::io
