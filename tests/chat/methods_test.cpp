// chat/methods.hpp and chat/strings.hpp: str and dict methods with Python semantics.
#include "tests/chat/test_support.hpp"

namespace rlforge::chat::test {
namespace {

TEST(ChatMethods, StartswithEndswith) {
  EXPECT_EQ(render("{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith('bc') }} "
                   "{{ 'abc'.startswith(('x', 'a')) }} {{ 'abc'.endswith(('x', 'y')) }} "
                   "{{ 'a'.startswith('abc') }}"),
            "True True True False False");
  expect_error("{{ 'abc'.startswith('a', 1) }}", "{}", error_kind::unsupported,
               {"start/end arguments"});
  expect_error("{{ 'abc'.startswith(1) }}", "{}", error_kind::runtime, {"must be str or a tuple"});
}

TEST(ChatMethods, SplitAndRsplit) {
  EXPECT_EQ(
      render("{{ 'a</t>b</t>c'.split('</t>')|tojson }} {{ 'a</t>b'.split('</t>')[-1] }} "
             "{{ '  a \t b\n'.split()|tojson }} {{ 'a,b,c'.split(',', 1)|tojson }} "
             "{{ 'a,b,c'.rsplit(',', 1)|tojson }} {{ ' a b c '.rsplit(None, 1)|tojson }} "
             "{{ ',a,,'.split(',')|tojson }}"),
      R"(["a", "b", "c"] b ["a", "b"] ["a", "b,c"] ["a,b", "c"] [" a b", "c"] ["", "a", "", ""])");
  expect_error("{{ 'a'.split('') }}", "{}", error_kind::runtime, {"empty separator"});
}

TEST(ChatMethods, StripFamilyTakesCharacters) {
  // Python semantics: strip('\n') keeps spaces (the transformers.js reference ignores the
  // argument and strips all whitespace; Qwen3's template relies on Python's behaviour).
  EXPECT_EQ(
      render("[{{ '\n  x  \n'.strip('\n') }}][{{ '\n\nx'.lstrip('\n') }}]"
             "[{{ 'x\n\n'.rstrip('\n') }}][{{ '\u00a0 x\t'.strip() }}][{{ 'xyx'.strip('x') }}]"),
      "[  x  ][x][x][x][y]");
}

TEST(ChatMethods, CaseReplaceJoin) {
  EXPECT_EQ(render("{{ 'Ab'.upper() }} {{ 'Ab'.lower() }} {{ 'aaa'.replace('a', 'b', 2) }} "
                   "{{ ', '.join(['x', 'y']) }}"),
            "AB ab bba x, y");
  expect_error("{{ 'ß'.upper() }}", "{}", error_kind::unsupported, {"non-ASCII"});
  expect_error("{{ ''.join([1]) }}", "{}", error_kind::runtime, {"must be a str, not int"});
}

TEST(ChatMethods, DictMethods) {
  const char* vars = R"({"d": {"a": 1, "b": null}})";
  EXPECT_EQ(render("{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 5) }} {{ d.get('b') }} "
                   "{{ d.keys()|tojson }} {{ d.values()|tojson }} {{ d.items()|tojson }}",
                   vars),
            R"(1 None 5 None ["a", "b"] [1, null] [["a", 1], ["b", null]])");
  expect_error("{{ d.get() }}", vars, error_kind::runtime, {"missing required argument 'key'"});
}

TEST(ChatMethods, RefusesPythonMethodsItCannotRun) {
  for (const char* m : {"format", "title", "capitalize", "find", "count", "zfill", "splitlines"})
    expect_error(std::string("{{ 'a'.") + m + "() }}", "{}", error_kind::unsupported,
                 {std::string("method str.") + m + "() is not supported"}, 1, 7);
  for (const char* m : {"append", "pop", "sort", "index"})
    expect_error(std::string("{{ [1].") + m + "(1) }}", "{}", error_kind::unsupported,
                 {std::string("method list.") + m + "()"});
  for (const char* m : {"update", "pop", "copy", "setdefault"})
    expect_error(std::string("{{ d.") + m + " }}", R"({"d": {"update": 1}})",
                 error_kind::unsupported, {std::string("method dict.") + m + "()"});
  expect_error("{% for x in [1] %}{{ loop.cycle('a', 'b') }}{% endfor %}", "{}",
               error_kind::unsupported, {"loop.cycle"});
}

} // namespace
} // namespace rlforge::chat::test
