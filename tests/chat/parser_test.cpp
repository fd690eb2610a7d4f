// chat/parser.hpp: precedence, statements, and refusal of tags outside the subset.
#include "tests/chat/test_support.hpp"

namespace rlforge::chat::test {
namespace {

TEST(ChatParser, FollowsJinjaOperatorPrecedence) {
  EXPECT_EQ(render("{{ 1 + 2 * 3 }}"), "7");
  EXPECT_EQ(render("{{ (1 + 2) * 3 }}"), "9");
  EXPECT_EQ(render("{{ 2 ** 3 ** 2 }}"), "64"); // Jinja's ** is left-associative
  // ~ binds tighter than + (1 + (2 ~ 'x') is str + int) and looser than *.
  expect_error("{{ 1 + 2 ~ 'x' }}", "{}", error_kind::runtime, {"'int' and 'str'"});
  EXPECT_EQ(render("{{ 'a' ~ 2 * 3 }}"), "a6");
  EXPECT_EQ(render("{{ -2 ** 2 }}"), "4"); // unary minus binds tighter than **
  EXPECT_EQ(render("{{ xs|length - 1 }}", R"({"xs": [1, 2, 3]})"), "2");
  EXPECT_EQ(render("{{ not 1 == 2 }}"), "True");
  EXPECT_EQ(render("{{ not x is defined }}"), "True");
  EXPECT_EQ(render("{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }}"), "True False");
  EXPECT_EQ(render("{{ 'b' if false else 'c' if true else 'd' }}"), "c");
  EXPECT_EQ(render("{{ true or false and false }}"), "True");
  EXPECT_EQ(render("{{ 1 if x }}|"), "|");
}

TEST(ChatParser, ParsesLiteralsAndPostfixChains) {
  EXPECT_EQ(render("{{ [1, 'a', none, true, (2, 3), {'k': [4]}] | tojson }}"),
            R"([1, "a", null, true, [2, 3], {"k": [4]}])");
  EXPECT_EQ(render("{{ {'a': {'b': 'c'}}['a'].b }}"), "c");
  EXPECT_EQ(render("{{ 'abc'.upper()[1:] }}"), "BC");
  EXPECT_EQ(render("{{ () | tojson }} {{ (1,) | tojson }} {{ [1, 2,] | length }}"), "[] [1] 2");
  EXPECT_EQ(render("{{ True }} {{ None }} {{ False }}"), "True None False");
}

TEST(ChatParser, ParsesTestsWithAndWithoutArguments) {
  EXPECT_EQ(render("{{ 6 is divisibleby 3 }} {{ 6 is divisibleby(4) }}"), "True False");
  EXPECT_EQ(render("{{ x is not none and x is string }}", R"({"x": "s"})"), "True");
  EXPECT_EQ(render("{{ 'a' if x is defined else 'b' }}"), "b");
  expect_error("{{ 1 is odd is even }}", "{}", error_kind::syntax, {"cannot be chained"});
}

TEST(ChatParser, ReportsSyntaxErrorsWithPositions) {
  expect_error("{% if x %}a", "{}", error_kind::syntax, {"expected '{% endif %}'"});
  expect_error("{% for x in y %}", "{}", error_kind::syntax, {"endfor"});
  expect_error("{% endif %}", "{}", error_kind::syntax, {"no open block"}, 1, 4);
  expect_error("{{ 1 + }}", "{}", error_kind::syntax, {"where an expression was expected"}, 1, 8);
  expect_error("{% for x y %}{% endfor %}", "{}", error_kind::syntax, {"expected 'in'"});
  expect_error("{{ f(a=1, 2) }}", "{}", error_kind::syntax, {"positional argument follows"});
  expect_error("{% break %}", "{}", error_kind::syntax, {"outside a for loop"});
  expect_error("{% macro m(a=1, b) %}{% endmacro %}", "{}", error_kind::syntax,
               {"without a default"});
  expect_error("{{ x[] }}", "{}", error_kind::syntax, {"empty subscript"});
  expect_error("{{ x.'a' }}", "{}", error_kind::syntax, {"attribute name"});
}

TEST(ChatParser, RefusesTagsAndSyntaxOutsideTheSubset) {
  for (const char* tag : {"include", "extends", "block", "import", "from", "call", "filter", "with",
                          "autoescape", "do", "trans"}) {
    expect_error(std::string("\n {% ") + tag + " x %}", "{}", error_kind::unsupported,
                 {std::string("tag '") + tag + "' is not supported"}, 2, 5);
  }
  expect_error("{% for x in y recursive %}{% endfor %}", "{}", error_kind::unsupported,
               {"recursive"});
  expect_error("{{ f(*args) }}", "{}", error_kind::unsupported, {"unpacking"});
  expect_error("{{ x[1, 2] }}", "{}", error_kind::unsupported, {"tuple subscripts"});
  expect_error("{% set x | upper %}a{% endset %}", "{}", error_kind::unsupported,
               {"filtered block set"});
}

} // namespace
} // namespace rlforge::chat::test
