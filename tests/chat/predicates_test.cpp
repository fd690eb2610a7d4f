// chat/predicates.hpp: every test with Python's answers, and the refusals.
#include "tests/chat/test_support.hpp"

namespace rlforge::chat::test {
namespace {

std::string answers(const std::string& test) {
  // Undefined, none, bool, int, float, str, list, dict, namespace
  return render("{{ missing is " + test + " }} {{ none is " + test + " }} {{ true is " + test +
                " }} {{ 1 is " + test + " }} {{ 1.5 is " + test + " }} {{ 's' is " + test +
                " }} {{ [1] is " + test + " }} {{ {'a': 1} is " + test + " }} {{ namespace() is " +
                test + " }}");
}

TEST(ChatPredicates, TypeTestsGivePythonsAnswers) {
  EXPECT_EQ(answers("defined"), "False True True True True True True True True");
  EXPECT_EQ(answers("undefined"), "True False False False False False False False False");
  EXPECT_EQ(answers("none"), "False True False False False False False False False");
  EXPECT_EQ(answers("boolean"), "False False True False False False False False False");
  EXPECT_EQ(answers("integer"), "False False False True False False False False False");
  EXPECT_EQ(answers("float"), "False False False False True False False False False");
  EXPECT_EQ(answers("number"), "False False True True True False False False False");
  EXPECT_EQ(answers("string"), "False False False False False True False False False");
  EXPECT_EQ(answers("mapping"), "False False False False False False False True False");
  EXPECT_EQ(answers("iterable"), "True False False False False True True True False");
  EXPECT_EQ(answers("sequence"), "True False False False False True True True False");
  EXPECT_EQ(answers("callable"), "True False False False False False False False False");
  EXPECT_EQ(
      render("{{ range is callable }} {{ true is true }} {{ 1 is true }} {{ false is false }}"),
      "True True False True");
}

TEST(ChatPredicates, ValueTests) {
  EXPECT_EQ(render("{{ 3 is odd }} {{ -3 is odd }} {{ 4 is even }} {{ 9 is divisibleby(3) }}"),
            "True True True True");
  EXPECT_EQ(render("{{ 1 is eq 1.0 }} {{ 'a' is equalto 'b' }} {{ 1 is ne 2 }} {{ 1 is lt 2 }} "
                   "{{ 2 is le 2 }} {{ 3 is gt 2 }} {{ 2 is ge 3 }} {{ 'a' is in 'cat' }}"),
            "True False True True True True False True");
  EXPECT_EQ(render("{{ x is not none }}", R"({"x": 0})"), "True");
  expect_error("{{ 1.5 is odd }}", "{}", error_kind::unsupported, {"test 'odd' on a float"});
  expect_error("{{ 1 is divisibleby(0) }}", "{}", error_kind::runtime, {"division by zero"});
  expect_error("{{ 1 is defined(2) }}", "{}", error_kind::runtime, {"at most 0 argument"});
}

TEST(ChatPredicates, RefusesUnknownTestsNamingThemAndWhere) {
  for (const char* t : {"sameas", "escaped", "lower", "upper", "filter", "test", "abc"})
    expect_error(std::string("{{ x is ") + t + " }}", "{}", error_kind::unsupported,
                 {std::string("test '") + t + "' is not supported"}, 1, 9);
}

} // namespace
} // namespace rlforge::chat::test
