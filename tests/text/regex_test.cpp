// text/unicode/regex.hpp: Oniguruma's meaning on PCRE2, HF's iteration over matches.
#include "tests/text/test_support.hpp"
#include "text/unicode/regex.hpp"

#include <thread>

namespace rlforge::text::test {
namespace {

using unicode::match_span;
using unicode::regex;

std::vector<std::string> matches(const regex& r, const std::string& text) {
  std::vector<match_span> spans;
  r.find_all(text, spans);
  std::vector<std::string> out;
  for (const auto& m : spans)
    out.push_back(text.substr(m.begin, m.end - m.begin));
  return out;
}

bool matches_whole(const std::string& pattern, const std::string& text) {
  auto r = regex::compile("^(?:" + pattern + ")$", "test");
  return !matches(r, text).empty();
}

TEST(Regex, WhitespaceIsTheWhiteSpaceProperty) {
  // Oniguruma's \s is White_Space: NEL and the ideographic space are in it, the Mongolian vowel
  // separator (a format character since Unicode 6.3) and the BOM are not. PCRE2's own \s would
  // take U+180E.
  EXPECT_TRUE(matches_whole("\\s", "\xC2\x85"));     // U+0085
  EXPECT_TRUE(matches_whole("\\s", "\xE3\x80\x80")); // U+3000
  EXPECT_TRUE(matches_whole("\\s", "\x0B"));
  EXPECT_FALSE(matches_whole("\\s", "\xE1\xA0\x8E")); // U+180E
  EXPECT_FALSE(matches_whole("\\s", "\xEF\xBB\xBF")); // U+FEFF
  EXPECT_TRUE(matches_whole("\\S", "\xE1\xA0\x8E"));
  EXPECT_TRUE(matches_whole("[^\\s\\p{L}]", "\xE1\xA0\x8E"));
  EXPECT_FALSE(matches_whole("[^\\s\\p{L}]", "\xE3\x80\x80"));
}

TEST(Regex, TranslatesOnigurumaEscapes) {
  EXPECT_EQ(unicode::translate_oniguruma(R"(\s+(?!\S))", "t"),
            R"(\p{White_Space}+(?!\P{White_Space}))");
  EXPECT_EQ(unicode::translate_oniguruma(R"(\h\H)", "t"),
            R"(\p{ASCII_Hex_Digit}\P{ASCII_Hex_Digit})");
  // Escaped backslashes, \Q...\E quotes and POSIX classes are left alone.
  EXPECT_EQ(unicode::translate_oniguruma(R"(\\s\Q\s\E[[:alpha:]\s])", "t"),
            R"(\\s\Q\s\E[[:alpha:]\p{White_Space}])");
  EXPECT_TRUE(matches_whole("\\w+", "a\xCC\x81_9")); // letters, a mark, Pc, digits
  EXPECT_FALSE(matches_whole("\\w", "\xC2\xB2"));    // ² is No, not Nd
  EXPECT_TRUE(matches_whole("[\\w-]+", "x-y"));
  EXPECT_TRUE(matches_whole("\\h+", "09afAF"));
  EXPECT_FALSE(matches_whole("\\h", "g"));
}

TEST(Regex, RefusesConstructsWhoseMeaningDiffers) {
  expect_error([] { regex::compile(R"(\bword\b)", "model.pre_tokenizer"); },
               {"model.pre_tokenizer", "\\bword\\b", "word boundary", "not supported"});
  expect_error([] { regex::compile(R"(\B)", "x"); }, {"\\B"});
  expect_error([] { regex::compile(R"([\W])", "x"); }, {"\\W inside a character class"});
  expect_error([] { regex::compile(R"([a-z[^aeiou]])", "x"); }, {"nested character class"});
  expect_error([] { regex::compile(R"([a-z&&b])", "x"); }, {"class intersection &&"});
  EXPECT_NO_THROW(regex::compile(R"([[:alpha:]&])", "x"));
}

TEST(Regex, CompileErrorsNameThePatternAndWhere) {
  expect_error([] { regex::compile("(unclosed", "pre_tokenizer.pattern"); },
               {"pre_tokenizer.pattern", "\"(unclosed\"", "does not compile"});
  expect_error([] { regex::compile("\xFF", "decoder.pattern"); },
               {"decoder.pattern", "invalid UTF-8"});
}

TEST(Regex, CaseInsensitiveGroupsAndUnicodeClasses) {
  auto r = regex::compile(R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|\p{L}+|\p{N})", "t");
  EXPECT_EQ(matches(r, "IT'S we'RE 12"),
            (std::vector<std::string>{"IT", "'S", "we", "'RE", "1", "2"}));
  EXPECT_EQ(matches(regex::compile(R"(\p{N}{1,3})", "t"), "1234567"),
            (std::vector<std::string>{"123", "456", "7"}));
}

TEST(Regex, IteratesAsOniguruma) {
  // An empty match right after the previous match is skipped: "baa" with a* gives the empty
  // match at 0 and "aa", not a second empty match at 3.
  auto r = regex::compile("a*", "t");
  std::vector<match_span> spans;
  r.find_all("baa", spans);
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0].begin, 0u);
  EXPECT_EQ(spans[0].end, 0u);
  EXPECT_EQ(spans[1].begin, 1u);
  EXPECT_EQ(spans[1].end, 3u);
  // Empty matches step over whole characters.
  spans.clear();
  regex::compile("x*", "t").find_all("é", spans);
  EXPECT_EQ(spans.size(), 2u); // before and after the two-byte character
}

TEST(Regex, LiteralMatchesItsTextOnly) {
  auto r = regex::literal("a.b*(c)", "t");
  EXPECT_EQ(matches(r, "a.b*(c) axbbc a.b*(c)"), (std::vector<std::string>{"a.b*(c)", "a.b*(c)"}));
  EXPECT_EQ(matches(regex::literal("▁", "t"), "▁x▁"), (std::vector<std::string>{"▁", "▁"}));
}

TEST(Regex, LongRunsDoNotExhaustTheMatcher) {
  auto r = regex::compile(
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
      "t");
  for (const std::string& run : {std::string(1 << 20, 'a'), std::string(1 << 20, ' '),
                                 std::string(1 << 20, '!'), std::string(1 << 18, '\n')}) {
    std::vector<match_span> spans;
    r.find_all(run + "x", spans);
    EXPECT_FALSE(spans.empty());
    EXPECT_EQ(spans.back().end, run.size() + 1);
  }
}

TEST(Regex, MatchesFromManyThreadsAtOnce) {
  auto r = regex::compile(R"(\p{L}+|\p{N}+|\s+)", "t");
  std::string text;
  for (int i = 0; i < 2000; ++i)
    text += "word" + std::to_string(i) + " ";
  std::vector<match_span> expected;
  r.find_all(text, expected);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int k = 0; k < 20; ++k) {
        std::vector<match_span> got;
        r.find_all(text, got);
        ok[t] += got.size() == expected.size();
      }
    });
  for (auto& th : threads)
    th.join();
  for (int v : ok)
    EXPECT_EQ(v, 20);
}

} // namespace
} // namespace rlforge::text::test
