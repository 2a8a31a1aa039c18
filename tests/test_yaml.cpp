// YAML: plain scalars resolve as YAML 1.2's core schema says, quoted ones
// stay strings, aliases share their node; hostile documents (deep nesting,
// billion laughs, recursive aliases, duplicate keys, foreign tags) are errors
// naming the source, line and column.
#include <catch2/catch.hpp>

#include "host/io/yaml.h"

#include <cmath>
#include <string>

using anatomy::io::parse_yaml;
using anatomy::io::YamlError;
using anatomy::io::YamlPtr;
using Kind = anatomy::io::YamlValue::Kind;

namespace {

// The value of `key: <text>`.
YamlPtr scalar(const std::string& text) {
  YamlPtr doc = parse_yaml("key: " + text + "\n", "test");
  REQUIRE(doc->kind == Kind::map);
  REQUIRE(doc->entries.size() == 1);
  return doc->entries[0].second;
}

std::string error_of(const std::string& text) {
  try {
    parse_yaml(text, "'f.yaml'");
  } catch (const YamlError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("yaml: plain scalars follow the core schema", "[yaml]") {
  for (const char* t : {"~", "null", "Null", "NULL", ""}) CHECK(scalar(t)->kind == Kind::null);
  for (const char* t : {"true", "True", "TRUE"}) CHECK((scalar(t)->kind == Kind::boolean && scalar(t)->boolean));
  for (const char* t : {"false", "False", "FALSE"}) CHECK((scalar(t)->kind == Kind::boolean && !scalar(t)->boolean));
  struct {
    const char* text;
    double value;
  } numbers[] = {{"0", 0},        {"-17", -17},    {"+5", 5},        {"0o17", 15},      {"0x1F", 31},
                 {"1.5", 1.5},    {"-.5", -0.5},   {"1e3", 1000},    {"2.5E-3", 0.0025}, {"1.", 1},
                 {"9007199254740992", 9007199254740992.0}, {"0.1", 0.1}};
  for (const auto& n : numbers) {
    INFO(n.text);
    YamlPtr v = scalar(n.text);
    CHECK(v->kind == Kind::number);
    CHECK(v->number == n.value);
  }
  CHECK(scalar(".inf")->number == INFINITY);
  CHECK(scalar("-.Inf")->number == -INFINITY);
  CHECK(std::isnan(scalar(".NaN")->number));
  // YAML 1.1's words and forms are strings in 1.2's core schema
  for (const char* t : {"yes", "no", "on", "off", "y", "1_000", "0b101", "1:30", "e3", ".", "+.nan", "0x", "1e", "nan", "inf"}) {
    INFO(t);
    YamlPtr v = scalar(t);
    CHECK(v->kind == Kind::string);
    CHECK(v->string == t);
  }
  // quoted and block scalars are strings, whatever they look like
  CHECK(scalar("'1'")->kind == Kind::string);
  CHECK(scalar("\"true\"")->string == "true");
  CHECK(scalar("''")->kind == Kind::string);
  CHECK(parse_yaml("key: |\n  12\n", "t")->entries[0].second->string == "12\n");
  // YAML's own tags
  CHECK(scalar("!!str 12")->string == "12");
  CHECK(scalar("!!float 3")->number == 3);
  CHECK(scalar("!!int 0x10")->number == 16);
  CHECK(scalar("!!bool true")->boolean);
  CHECK(scalar("!!null ''")->kind == Kind::null);
}

TEST_CASE("yaml: maps, sequences and keys", "[yaml]") {
  YamlPtr doc = parse_yaml("a:\n  - 1\n  - [x, {y: 2}]\nb: {}\n3: three\ntrue: yes\n", "t");
  REQUIRE(doc->entries.size() == 4);
  CHECK(doc->entries[0].first->string == "a");
  const auto& seq = doc->entries[0].second;
  REQUIRE(seq->kind == Kind::sequence);
  CHECK(seq->items[0]->number == 1);
  CHECK(seq->items[1]->items[1]->entries[0].second->number == 2);
  CHECK(doc->entries[1].second->kind == Kind::map);
  CHECK(doc->entries[2].first->kind == Kind::number);
  CHECK(doc->entries[3].first->kind == Kind::boolean);
  CHECK(doc->entries[3].second->line == 6);
  CHECK(doc->entries[3].second->column == 7);
  CHECK(parse_yaml("", "t")->kind == Kind::null);
  CHECK(parse_yaml("# only a comment\n", "t")->kind == Kind::null);
  CHECK(parse_yaml("---\nx\n...\n", "t")->string == "x");
}

TEST_CASE("yaml: aliases share their node; billion laughs stays small", "[yaml]") {
  YamlPtr doc = parse_yaml("a: &x [1, 2]\nb: *x\n", "t");
  CHECK(doc->entries[0].second == doc->entries[1].second);
  std::string lol = "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n";
  for (int i = 1; i < 12; ++i) {
    std::string p = "*a" + std::to_string(i - 1);
    lol += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [" + p;
    for (int k = 1; k < 9; ++k) lol += ", " + p;
    lol += "]\n";
  }
  doc = parse_yaml(lol, "t");  // 9^12 leaves if expanded
  REQUIRE(doc->entries.size() == 12);
  const auto& top = doc->entries[11].second;
  CHECK(top->items.size() == 9);
  CHECK(top->items[0] == top->items[8]);
  CHECK(top->items[0] == doc->entries[10].second);
}

TEST_CASE("yaml: hostile and malformed documents are errors with a position", "[yaml]") {
  CHECK(error_of("a: 1\nb: 2\na: 3\n") ==
        "'f.yaml': line 3, column 1: the key 'a' appears twice in a map (first at line 1, column 1)");
  CHECK_THAT(error_of("1: a\n1.0: b\n"), Catch::Contains("line 2, column 1: the key 1 appears twice"));
  CHECK_THAT(error_of(std::string(10000, '[') + std::string(10000, ']')),
             Catch::Contains("line 1, column 257: sequences and maps nest deeper than 256 levels"));
  CHECK_THAT(error_of(std::string(10000, '[')), Catch::StartsWith("'f.yaml': line 1, column "));
  CHECK_THAT(error_of("a: &x [1, *x]\n"), Catch::Contains("line 1, column 11: an alias refers to a node that contains it"));
  CHECK_THAT(error_of("a: *nothing\n"), Catch::Contains("line 1, column 4"));
  CHECK_THAT(error_of("a: !!python/object:os.system x\n"), Catch::Contains("the tag 'tag:yaml.org,2002:python/object:os.system'"));
  CHECK_THAT(error_of("a: !custom x\n"), Catch::Contains("the tag '!custom'"));
  CHECK_THAT(error_of("a: 9007199254740993\n"), Catch::Contains("line 1, column 4: the integer 9007199254740993 is beyond 2^53"));
  CHECK_THAT(error_of("a: !!int 1.5\n"), Catch::Contains("tagged !!int"));
  CHECK_THAT(error_of("a: 1\n---\nb: 2\n"), Catch::Contains("line 2, column 1: a second document"));
  CHECK_THAT(error_of("? [1, 2]\n: x\n"), Catch::Contains("line 1, column 3: a key is a sequence or a map"));
  CHECK_THAT(error_of("~: x\n"), Catch::Contains("a key is null"));
  // the node bound, with a small one: the sequence and 999 items pass, one more does not
  std::string wide = "[";
  for (int i = 0; i < 1000; ++i) wide += "1,";
  CHECK_THROWS_WITH(parse_yaml(wide + "1]", "w", 1000), "w: line 1, column 2000: the document has more than 1000 nodes");
  CHECK(parse_yaml(wide.substr(0, wide.size() - 2) + "]", "w", 1000)->items.size() == 999);
  CHECK_THAT(error_of(".nan: x\n"), Catch::Contains("a key is .nan"));
  CHECK(error_of("a: 'unterminated\n") == "'f.yaml': line 1, column 4: a quoted string is not closed");
  CHECK_THAT(error_of("a: \"x\\\"\nb: 1\n"), Catch::Contains("line 1, column 4: a quoted string is not closed"));
  CHECK(parse_yaml("a: 'it''s'\nb: \"q\\\"\"\n", "t")->entries[1].second->string == "q\"");
  CHECK_THAT(error_of("a: [1, 2\n"), Catch::Contains("end of sequence flow not found"));
  CHECK_THAT(error_of("a:\n  b: 1\n c: 2\n"), Catch::StartsWith("'f.yaml': line 3, column "));
}
