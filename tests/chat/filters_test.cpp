// chat/filters.hpp: every filter, its arguments, and the refusals.
#include "tests/chat/test_support.hpp"

namespace rlforge::chat::test {
namespace {

TEST(ChatFilters, TojsonMatchesTransformersJsonDumps) {
  const char* vars =
      R"({"x": {"b": [1, 2.5, -3e-07, true, null], "a": "é\n\"q\"\u0001", "e": {}, "l": []}})";
  EXPECT_EQ(render("{{ x|tojson }}", vars),
            R"({"b": [1, 2.5, -3e-07, true, null], "a": "é\n\"q\"\u0001", "e": {}, "l": []})");
  EXPECT_EQ(render("{{ x|tojson(indent=2) }}", vars),
            "{\n  \"b\": [\n    1,\n    2.5,\n    -3e-07,\n    true,\n    null\n  ],\n"
            "  \"a\": \"é\\n\\\"q\\\"\\u0001\",\n  \"e\": {},\n  \"l\": []\n}");
  EXPECT_EQ(render("{{ x.b|tojson(indent=0) }}", vars), "[\n1,\n2.5,\n-3e-07,\ntrue,\nnull\n]");
  EXPECT_EQ(render("{{ x|tojson(sort_keys=true, separators=(',', ':')) }}", vars),
            R"({"a":"é\n\"q\"\u0001","b":[1,2.5,-3e-07,true,null],"e":{},"l":[]})");
  EXPECT_EQ(render("{{ 'é😀<&>'|tojson(ensure_ascii=true) }}"), R"("\u00e9\ud83d\ude00<&>")");
  EXPECT_EQ(render("{{ 2.0|tojson }} {{ 1e16|tojson }}"), "2.0 1e+16");
  expect_error("{{ missing|tojson }}", "{}", error_kind::runtime,
               {"Undefined is not JSON serializable"});
  expect_error("{{ namespace()|tojson }}", "{}", error_kind::runtime, {"not JSON serializable"});
  expect_error("{{ x|tojson(4) }}", "{}", error_kind::unsupported, {"positional arguments"});
  expect_error("{{ x|tojson(width=4) }}", "{}", error_kind::runtime,
               {"unexpected keyword argument 'width'"});
}

TEST(ChatFilters, TrimSafeStringLength) {
  EXPECT_EQ(render("[{{ '  a b \n'|trim }}][{{ 'xxaxx'|trim('x') }}][{{ 5|string }}]"
                   "[{{ none|safe }}][{{ missing|trim }}]"),
            "[a b][a][5][None][]");
  EXPECT_EQ(render("{{ 'héllo'|length }} {{ [1, 2]|count }} {{ {'a': 1}|length }} "
                   "{{ missing|length }}"),
            "5 2 1 0");
  expect_error("{{ 5|length }}", "{}", error_kind::runtime, {"'int' has no len()"});
  expect_error("{{ [1]|string }}", "{}", error_kind::unsupported, {"list"});
}

TEST(ChatFilters, DefaultReplacesUndefinedOrFalsy) {
  EXPECT_EQ(render("{{ missing|default('d') }} {{ ''|default('d') }} {{ ''|default('d', true) }} "
                   "{{ none|d('d') }} {{ none|default('d', boolean=true) }} [{{ missing|d }}]"),
            "d  d None d []");
}

TEST(ChatFilters, ItemsFirstLastListReverseJoin) {
  const char* vars =
      R"({"d": {"k": 1, "j": [2]}, "xs": ["a", "b", "c"], "ms": [{"n": "x"}, {"n": "y"}]})";
  EXPECT_EQ(render("{% for k, v in d|items %}{{ k }}:{{ v|tojson }};{% endfor %}", vars),
            "k:1;j:[2];");
  EXPECT_EQ(render("{{ missing|items|length }}"), "0");
  EXPECT_EQ(render("{{ xs|first }}{{ xs|last }}{{ 'hé'|last }}{{ d|first }}", vars), "acék");
  EXPECT_EQ(render("{{ []|first is defined }}"), "False");
  EXPECT_EQ(render("{{ 'ab'|list|tojson }} {{ d|list|tojson }} {{ xs|reverse|join('-') }} "
                   "{{ 'abc'|reverse }}",
                   vars),
            R"(["a", "b"] ["k", "j"] c-b-a cba)");
  EXPECT_EQ(render("{{ xs|join }} {{ ms|join(', ', attribute='n') }} {{ [1, 2]|join('+') }}", vars),
            "abc x, y 1+2");
  expect_error("{{ 5|items }}", "{}", error_kind::runtime, {"mapping"});
}

TEST(ChatFilters, UpperLowerReplaceIndent) {
  EXPECT_EQ(render("{{ 'aB'|upper }}{{ 'aB'|lower }} {{ 'a-b-c'|replace('-', '+', 1) }} "
                   "{{ 'ab'|replace('', '.') }}"),
            "ABab a+b-c .a.b.");
  expect_error("{{ 'é'|upper }}", "{}", error_kind::unsupported, {"non-ASCII"});
  EXPECT_EQ(render("{{ 'a\nb\n\nc'|indent }}"), "a\n    b\n\n    c");
  EXPECT_EQ(render("{{ 'a\nb\n'|indent(2, first=true) }}"), "  a\n  b\n");
  EXPECT_EQ(render("{{ 'a\n\nb'|indent('>', blank=true) }}"), "a\n>\n>b");
}

TEST(ChatFilters, MapSelectReject) {
  const char* vars =
      R"({"ms": [{"role": "user", "n": 1}, {"role": "tool"}, {"role": "user", "n": 3}]})";
  EXPECT_EQ(render("{{ ms|map(attribute='role')|join(',') }}", vars), "user,tool,user");
  EXPECT_EQ(render("{{ ms|map(attribute='n', default=0)|list|tojson }}", vars), "[1, 0, 3]");
  EXPECT_EQ(render("{{ ['a', 'B']|map('upper')|join }}"), "AB");
  EXPECT_EQ(render("{{ ms|selectattr('role', 'equalto', 'user')|list|length }}", vars), "2");
  EXPECT_EQ(render("{{ ms|rejectattr('n')|map(attribute='role')|join }}", vars), "tool");
  EXPECT_EQ(render("{{ ms|selectattr('n', 'defined')|length }}", vars), "2");
  EXPECT_EQ(render("{{ [1, 2, 3, 4]|select('odd')|join }} {{ [1, 2, 3, 4]|reject('odd')|join }} "
                   "{{ [0, 1, '']|select|list|tojson }}"),
            "13 24 [1]");
  expect_error("{{ ms|selectattr('role', 'sameas', 'x')|list }}", vars, error_kind::unsupported,
               {"test 'sameas' is not supported"});
}

TEST(ChatFilters, RefusesUnknownFiltersNamingThemAndWhere) {
  for (const char* f : {"unique", "sort", "dictsort", "wordcount", "xmlattr", "batch", "sum",
                        "capitalize", "title", "int", "float", "abs", "round", "pprint"}) {
    expect_error(std::string("a\n{{ x|") + f + " }}", "{}", error_kind::unsupported,
                 {std::string("filter '") + f + "' is not supported"}, 2, 6);
  }
  // Refused when the template is compiled, even in a branch no render would take.
  EXPECT_THROW(jinja_template("{% if false %}{{ x|unique }}{% endif %}"), template_error);
}

} // namespace
} // namespace rlforge::chat::test
