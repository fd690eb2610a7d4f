// chat/lexer.hpp: whitespace control with trim_blocks + lstrip_blocks, comments, literals,
// positions.
#include "chat/lexer.hpp"
#include "tests/chat/test_support.hpp"

namespace rlforge::chat::test {
namespace {

using detail::normalize_newlines;
using detail::token_kind;
using detail::tokenize;

TEST(ChatLexer, NormalizesLineBreaksAndDropsOneTrailingNewline) {
  EXPECT_EQ(normalize_newlines("a\r\nb\rc\n"), "a\nb\nc");
  EXPECT_EQ(normalize_newlines("a\n\n"), "a\n");
  EXPECT_EQ(normalize_newlines("x\u2028y"), "x\ny");
  EXPECT_EQ(render("hi\n"), "hi");
  EXPECT_EQ(render("hi\n\n"), "hi\n");
}

TEST(ChatLexer, TrimBlocksRemovesTheNewlineAfterABlockTagOnly) {
  EXPECT_EQ(render("{% if true %}\nyes\n{% endif %}\nend"), "yes\nend");
  EXPECT_EQ(render("{{ 'a' }}\nb"), "a\nb");
  EXPECT_EQ(render("{# note #}\nb"), "b");
  EXPECT_EQ(render("{% if true +%}\nyes{% endif %}"), "\nyes");
}

TEST(ChatLexer, LstripBlocksRemovesIndentationBeforeBlockTagsNotExpressions) {
  EXPECT_EQ(render("a\n    {% if true %}x{% endif %}"), "a\nx");
  EXPECT_EQ(render("a\n    {{ 'x' }}"), "a\n    x");
  EXPECT_EQ(render("a  {% if true %}x{% endif %}"), "a  x");
  EXPECT_EQ(render("  {% if true %}x{% endif %}"), "x");
  EXPECT_EQ(render("a\n  {%+ if true %}x{% endif %}"), "a\n  x");
  EXPECT_EQ(render("{% if true %}\n    {% if true %}y{% endif %}{% endif %}"), "y");
}

TEST(ChatLexer, DashesStripAllWhitespaceOnTheirSide) {
  EXPECT_EQ(render("a \n\t {%- if true -%} \n b {%- endif %}"), "ab");
  EXPECT_EQ(render("a \n {{- 'x' -}} \n b"), "axb");
  EXPECT_EQ(render("a \n {#- c -#} \n b"), "ab");
  EXPECT_EQ(render("a\u3000{{- 'x' }}"), "ax"); // Python whitespace, not only ASCII
}

TEST(ChatLexer, DecodesStringEscapesAsPython) {
  EXPECT_EQ(render(R"({{ 'a\nb\t\'\"\\' }})"), "a\nb\t'\"\\");
  EXPECT_EQ(render(R"({{ "\x41\u00e9\U0001F600" }})"), "Aé😀");
  EXPECT_EQ(render(R"({{ '\d' }})"), "\\d");
  EXPECT_EQ(render(R"({{ '\101' }})"), "A");
  EXPECT_EQ(render("{{ 'a' 'b' \"c\" }}"), "abc");
  expect_error(R"({{ '\x4' }})", "{}", error_kind::syntax, {"truncated \\x"});
  expect_error(R"({{ '\N{DASH}' }})", "{}", error_kind::unsupported, {"named escapes"});
  expect_error(R"({{ '\ud800' }})", "{}", error_kind::unsupported, {"surrogate"});
}

TEST(ChatLexer, ReadsNumbers) {
  EXPECT_EQ(render("{{ 1_000 + 0x10 + 0o10 + 0b10 }}"), "1026");
  EXPECT_EQ(render("{{ 1.5 }} {{ 2e3 }} {{ 1.5e-7 }}"), "1.5 2000.0 1.5e-07");
  EXPECT_EQ(render("{{ [[1, 2]].0.1 }}"), "2");
  expect_error("{{ 99999999999999999999 }}", "{}", error_kind::unsupported, {"too large"});
}

TEST(ChatLexer, DictLiteralBracesDoNotCloseTheExpression) {
  EXPECT_EQ(render("{{ {'a': {'b': 1}}|tojson }}"), "{\"a\": {\"b\": 1}}");
}

TEST(ChatLexer, TokenPositionsAreLineAndCodePointColumn) {
  const auto tokens = tokenize("é{{ x }}\n  {{ y }}");
  ASSERT_GE(tokens.size(), 7u);
  EXPECT_EQ(tokens[1].kind, token_kind::variable_begin);
  EXPECT_EQ(tokens[1].where.line, 1);
  EXPECT_EQ(tokens[1].where.column, 2);
  EXPECT_EQ(tokens[2].text, "x");
  EXPECT_EQ(tokens[2].where.column, 5);
  EXPECT_EQ(tokens[6].text, "y");
  EXPECT_EQ(tokens[6].where.line, 2);
  EXPECT_EQ(tokens[6].where.column, 6);
}

TEST(ChatLexer, RefusesMalformedInputNamingThePosition) {
  expect_error("ab\n{{ x", "{}", error_kind::syntax, {"never closed"}, 2, 1);
  expect_error("{# open", "{}", error_kind::syntax, {"unterminated comment"}, 1, 1);
  expect_error("{{ 'abc }}", "{}", error_kind::syntax, {"unterminated string"}, 1, 4);
  expect_error("{{ a ; b }}", "{}", error_kind::syntax, {"unexpected character ';'"}, 1, 6);
  expect_error("{{ (a ] }}", "{}", error_kind::syntax, {"unexpected ']'"}, 1, 7);
  expect_error("x\n  {% raw %}{{ }}{% endraw %}", "{}", error_kind::unsupported, {"tag 'raw'"}, 2,
               6);
  EXPECT_THROW(jinja_template("\xff"), template_error);
}

} // namespace
} // namespace rlforge::chat::test
