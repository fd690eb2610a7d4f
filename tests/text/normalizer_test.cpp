// text/hf/normalizer.hpp: every supported normalizer type, and the refusals.
#include "tests/text/test_support.hpp"
#include "text/hf/normalizer.hpp"

namespace rlforge::text::test {
namespace {

using nlohmann::json;

std::string normalize(const json& j, std::string s, bool* start_kept = nullptr) {
  auto n = hf::make_normalizer(j, "normalizer");
  bool kept = true;
  n->normalize(s, kept);
  if (start_kept != nullptr)
    *start_kept = kept;
  return s;
}

TEST(Normalizer, UnicodeForms) {
  EXPECT_EQ(normalize({{"type", "NFC"}}, "e\xCC\x81te\xCC\x81"), "été");
  EXPECT_EQ(normalize({{"type", "NFD"}}, "é"), "e\xCC\x81");
  EXPECT_EQ(normalize({{"type", "NFKC"}}, "ﬁ① ²"), "fi1 2");
  EXPECT_EQ(normalize({{"type", "NFKD"}}, "ﬁé"), "fie\xCC\x81");
  // Hangul jamo compose under NFC; ASCII passes through untouched.
  EXPECT_EQ(normalize({{"type", "NFC"}}, "\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), "각");
  EXPECT_EQ(normalize({{"type", "NFC"}}, "plain"), "plain");
}

TEST(Normalizer, LowercaseIsPerCharacterFullMapping) {
  EXPECT_EQ(normalize({{"type", "Lowercase"}}, "HeLLo ÉCOLE"), "hello école");
  // U+0130 lowercases to i + combining dot; a capital sigma is σ even at the end of a word (no
  // context, as Rust's char::to_lowercase).
  EXPECT_EQ(normalize({{"type", "Lowercase"}}, "İ"), "i\xCC\x87");
  EXPECT_EQ(normalize({{"type", "Lowercase"}}, "ΟΔΟΣ"), "οδοσ");
}

TEST(Normalizer, StripUsesUnicodeWhitespace) {
  bool kept = true;
  EXPECT_EQ(normalize({{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
                      "\xE3\x80\x80 \tx y\n ", &kept),
            "x y");
  EXPECT_FALSE(kept); // leading characters were removed
  EXPECT_EQ(
      normalize({{"type", "Strip"}, {"strip_left", false}, {"strip_right", true}}, "  x  ", &kept),
      "  x");
  EXPECT_TRUE(kept);
  EXPECT_EQ(normalize({{"type", "Strip"}, {"strip_left", true}, {"strip_right", false}}, "  x  "),
            "x  ");
  EXPECT_EQ(normalize({{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}}, "   "), "");
}

TEST(Normalizer, StripAccentsRemovesMarks) {
  bool kept = true;
  EXPECT_EQ(normalize({{"type", "StripAccents"}}, "e\xCC\x81t\xCC\xA7", &kept), "et");
  EXPECT_TRUE(kept);
  EXPECT_EQ(normalize({{"type", "StripAccents"}}, "\xCC\x81x", &kept), "x");
  EXPECT_FALSE(kept);
}

TEST(Normalizer, PrependSkipsEmptyText) {
  json p{{"type", "Prepend"}, {"prepend", "▁"}};
  EXPECT_EQ(normalize(p, "Hey"), "▁Hey");
  EXPECT_EQ(normalize(p, ""), "");
}

TEST(Normalizer, ReplaceStringAndRegex) {
  EXPECT_EQ(
      normalize({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}, " a  b "),
      "▁a▁▁b▁");
  EXPECT_EQ(normalize({{"type", "Replace"}, {"pattern", {{"Regex", "\\s+"}}}, {"content", "_"}},
                      "a \t b\u3000c"),
            "a_b_c");
  bool kept = true;
  EXPECT_EQ(normalize({{"type", "Replace"}, {"pattern", {{"String", "x"}}}, {"content", ""}}, "xxa",
                      &kept),
            "a");
  EXPECT_FALSE(kept);
}

TEST(Normalizer, SequenceRunsInOrder) {
  json seq{
      {"type", "Sequence"},
      {"normalizers",
       json::array({{{"type", "Prepend"}, {"prepend", "▁"}},
                    {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}})}};
  EXPECT_EQ(normalize(seq, "Hello world"), "▁Hello▁world");
}

TEST(Normalizer, RefusesUnsupportedTypesNamingThem) {
  for (const char* type : {"BertNormalizer", "Precompiled", "Nmt", "ByteLevel", "Uppercase"})
    expect_error(
        [&] {
          hf::make_normalizer({{"type", type}}, "tokenizer.json: normalizer");
        },
        {"tokenizer.json: normalizer",
         std::string("unsupported normalizer type \"") + type + "\""});
  expect_error(
      [] {
        hf::make_normalizer({{"type", "Sequence"},
                             {"normalizers", json::array({{{"type", "NFC"}}, {{"type", "Nmt"}}})}},
                            "normalizer");
      },
      {"normalizer.normalizers[1]", "\"Nmt\""});
}

TEST(Normalizer, RefusesMalformedFields) {
  expect_error(
      [] {
        hf::make_normalizer({{"type", "Strip"}, {"strip_left", true}}, "n");
      },
      {"n.strip_right", "missing"});
  expect_error(
      [] {
        hf::make_normalizer({{"type", "Prepend"}, {"prepend", 3}}, "n");
      },
      {"n.prepend", "expected a string"});
  expect_error(
      [] {
        hf::make_normalizer({{"type", "NFC"}, {"form", "C"}}, "n");
      },
      {"n.form", "unknown field"});
  expect_error(
      [] {
        hf::make_normalizer({{"type", "Replace"}, {"pattern", {{"Glob", "*"}}}, {"content", ""}},
                            "n");
      },
      {"n.pattern", "\"Glob\""});
  expect_error([] { hf::make_normalizer(json::array(), "n"); }, {"n", "expected an object"});
  expect_error([] { hf::make_normalizer({{"kind", "NFC"}}, "n"); }, {"n.type", "missing"});
}

} // namespace
} // namespace rlforge::text::test
