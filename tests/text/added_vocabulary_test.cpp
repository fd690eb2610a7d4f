// text/hf/added_vocabulary.hpp through the tokenizer: leftmost-longest matching, lstrip, rstrip,
// single_word, normalized and raw matching, special tokens, and the refusals.
#include "tests/text/test_support.hpp"
#include "text/tokenizer.hpp"

namespace rlforge::text::test {
namespace {

using nlohmann::json;

// A character-level model (no merges, no pre-tokenizer, no decoder): every character is a token,
// so the tests read the sections the added vocabulary cut.
std::vector<std::string> chars() {
  std::vector<std::string> out;
  for (char c : std::string("abcdefghijklmnopqrstuvwxyzABCDIRY .,<>[]/\t"))
    out.emplace_back(1, c);
  return out;
}
const int first_added = static_cast<int>(chars().size());

tokenizer make(const json& added_tokens, const json& normalizer = nullptr) {
  return tokenizer::from_json(
      tokenizer_doc(bpe_json(chars(), {}), normalizer, nullptr, nullptr, nullptr, added_tokens));
}

TEST(AddedVocabulary, LeftmostLongestMatch) {
  auto tok = make(json::array({added(first_added, "<a>"), added(first_added + 1, "<a><b>")}));
  EXPECT_EQ(spell(tok, tok.encode("x<a><b>y<a>", false)), "x|<a><b>|y|<a>");
  EXPECT_EQ(spell(tok, tok.encode("<a<a>>", false)), "<|a|<a>|>");
}

TEST(AddedVocabulary, LstripAndRstripSwallowWhitespace) {
  auto l = make(json::array({added(first_added, "<m>", true, {{"lstrip", true}})}));
  EXPECT_EQ(spell(l, l.encode(" a \t <m> b", false)), " |a|<m>| |b");
  auto r = make(json::array({added(first_added, "<m>", true, {{"rstrip", true}})}));
  EXPECT_EQ(spell(r, r.encode("a <m> \t b", false)), "a| |<m>|b");
  // Unicode whitespace counts (U+3000 is not in this vocabulary, so it would otherwise be lost).
  EXPECT_EQ(spell(r, r.encode("<m>\xE3\x80\x80"
                              "b",
                              false)),
            "<m>|b");
}

TEST(AddedVocabulary, SingleWordNeedsNonWordNeighbours) {
  auto tok = make(json::array({added(first_added, "ab", false, {{"single_word", true}})}));
  EXPECT_EQ(spell(tok, tok.encode("ab cab ab. xab", false)), "ab| |c|a|b| |ab|.| |x|a|b");
  // Without single_word the token is cut out of words too.
  auto loose = make(json::array({added(first_added, "ab", false)}));
  EXPECT_EQ(spell(loose, loose.encode("cab", false)), "c|ab");
}

TEST(AddedVocabulary, NormalizedTokensMatchTheNormalizedText) {
  json lower{{"type", "Lowercase"}};
  auto tok = make(json::array({added(first_added, "yesterday", false), // normalized
                               added(first_added + 1, "[DAY]", true),  // raw
                               added(first_added + 2, "ABC", false, {{"normalized", false}})}),
                  lower);
  EXPECT_EQ(spell(tok, tok.encode("I read Yesterday", false)), "i| |r|e|a|d| |yesterday");
  EXPECT_EQ(spell(tok, tok.encode("a [DAY] b", false)), "a| |[DAY]| |b");
  // A raw token matches only its exact spelling, before normalization.
  EXPECT_EQ(spell(tok, tok.encode("ABC abc", false)), "ABC| |a|b|c");
  EXPECT_EQ(spell(tok, tok.encode("[day]", false)), "[|d|a|y|]");
}

TEST(AddedVocabulary, DecodeUsesTheNormalizedSpellingOfNormalizedTokens) {
  // HF tokenizers 0.23: a normalized added token decodes as its normalized form.
  auto tok = make(json::array({added(first_added, "\xEF\xAC\x81x", false)}), {{"type", "NFKC"}});
  auto ids = tok.encode("a fix", false);
  EXPECT_EQ(spell(tok, ids), "a| |\xEF\xAC\x81x");
  EXPECT_EQ(tok.decode({ids.back()}), "fix");
}

TEST(AddedVocabulary, SpecialTokensAreSkippedOnRequest) {
  auto tok =
      make(json::array({added(first_added, "<s>", true), added(first_added + 1, "<x>", false)}));
  auto ids = tok.encode("<s>a<x>", false);
  EXPECT_EQ(spell(tok, ids), "<s>|a|<x>");
  EXPECT_TRUE(tok.is_special(first_added));
  EXPECT_FALSE(tok.is_special(first_added + 1));
  EXPECT_EQ(tok.decode(ids, false), "<s> a <x>"); // no decoder: tokens joined by spaces
  EXPECT_EQ(tok.decode(ids, true), "a <x>");
}

TEST(AddedVocabulary, EmptyContentIsIgnored) {
  auto tok = make(json::array({added(first_added, "", false)}));
  EXPECT_EQ(spell(tok, tok.encode("ab", false)), "a|b");
}

TEST(AddedVocabulary, RefusesInconsistentEntries) {
  expect_error(
      [] {
        make(json::array({added(first_added, "<a>"), added(first_added + 1, "<a>")}));
      },
      {"added_tokens[1]", "\"<a>\" already has id"});
  expect_error(
      [] {
        make(json::array({added(first_added, "<a>"), added(first_added, "<b>")}));
      },
      {"added_tokens[1]", "is given to both"});
  expect_error([] { make(json::array({added(3, "<a>")})); },
               {"\"<a>\"", "is the model's token \"d\""});
  expect_error([] { make(json::array({added(first_added, "a")})); },
               {"\"a\"", "the model vocabulary gives it id 0"});
  expect_error(
      [] {
        make(json::array({added(first_added, "<a>", true, {{"lstrip", "yes"}})}));
      },
      {"added_tokens[0].lstrip", "expected a boolean"});
  expect_error(
      [] {
        make(json::array({added(first_added, "<a>", true, {{"weight", 1}})}));
      },
      {"added_tokens[0].weight", "unknown field"});
}

} // namespace
} // namespace rlforge::text::test
