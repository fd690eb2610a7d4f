// text/unicode/utf8.hpp: validation (RFC 3629), decoding, lossy conversion.
#include "tests/text/test_support.hpp"
#include "text/unicode/utf8.hpp"

namespace rlforge::text::test {
namespace {

using unicode::find_invalid_utf8;
using unicode::from_utf8_lossy;

const std::string replacement = "\xEF\xBF\xBD";

TEST(Utf8, AcceptsWellFormedText) {
  for (std::string s : {std::string(""), std::string("plain ascii"), std::string("é中😀"),
                        std::string("\x7F\xC2\x80\xDF\xBF\xE0\xA0\x80\xEF\xBF\xBF"),
                        std::string("\xF0\x90\x80\x80\xF4\x8F\xBF\xBF"), std::string(1, '\0')})
    EXPECT_EQ(find_invalid_utf8(s), std::string::npos) << s;
}

TEST(Utf8, FindsTheFirstIllFormedByte) {
  struct bad {
    std::string text;
    size_t at;
  };
  for (const bad& b : {bad{"abc\xFF", 3},          // never a lead byte
                       bad{"\x80", 0},             // lone continuation
                       bad{"ok\xC0\xAF", 2},       // overlong '/'
                       bad{"\xE0\x80\xAF", 0},     // overlong 3-byte
                       bad{"\xED\xA0\x80", 0},     // UTF-16 surrogate
                       bad{"\xF4\x90\x80\x80", 0}, // above U+10FFFF
                       bad{"xx\xE4\xB8", 2},       // truncated at the end
                       bad{"\xE4\xB8x", 0},        // truncated in the middle
                       bad{"12345678\xC3", 8}})    // after the ASCII fast path
    EXPECT_EQ(find_invalid_utf8(b.text), b.at) << b.text;
}

TEST(Utf8, RequireValidNamesWhatAndWhere) {
  expect_error([] { unicode::require_valid_utf8("ab\xFE", "encode: text"); },
               {"encode: text", "invalid UTF-8 at byte 2", "0xFE"});
}

TEST(Utf8, LossyConversionReplacesMaximalSubparts) {
  EXPECT_EQ(from_utf8_lossy("a\xE4\xB8z"), "a" + replacement + "z"); // one subpart
  EXPECT_EQ(from_utf8_lossy("\xFF\xFE"), replacement + replacement);
  EXPECT_EQ(from_utf8_lossy("\xF0\x9F\x98"), replacement); // truncated emoji
  EXPECT_EQ(from_utf8_lossy("\xED\xA0\x80"), replacement + replacement + replacement);
  EXPECT_EQ(from_utf8_lossy("\xC3\xA9t\xC3\xA9"), "été");
}

TEST(Utf8, DecodesAndEncodesCodePoints) {
  std::string s = "aé中😀";
  size_t at = 0;
  EXPECT_EQ(unicode::next_code_point(s, at), U'a');
  EXPECT_EQ(unicode::next_code_point(s, at), U'é');
  EXPECT_EQ(unicode::next_code_point(s, at), U'中');
  EXPECT_EQ(unicode::next_code_point(s, at), U'😀');
  EXPECT_EQ(at, s.size());
  EXPECT_EQ(unicode::last_code_point(s), U'😀');
  std::string out;
  for (char32_t c : {U'a', U'é', U'中', U'😀'})
    unicode::append_utf8(out, c);
  EXPECT_EQ(out, s);
  EXPECT_EQ(unicode::count_code_points(s), 4u);
}

} // namespace
} // namespace rlforge::text::test
