// backends/model/stop_strings.hpp: stop strings found in the text of generated tokens as it is
// released: across tokens, inside multi-byte characters only once they are complete, the one that
// ends first when several complete together, after long texts, past ids that name no token.
#include "backends/model/stop_strings.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backends/error.hpp"
#include "stop_strings_support.hpp"
#include "text/model_tokenizer.hpp"

using namespace rlforge;
using namespace rlforge::backends;
using rlforge::backends::testing::tiny_tokenizer;

namespace {

// GPT-2's byte-to-character table (the byte-level tokenizer's spelling of byte `b`), as UTF-8.
std::string byte_spelling(unsigned b) {
  auto printable = [](unsigned x) {
    return (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF);
  };
  unsigned cp = b;
  if (!printable(b)) {
    cp = 256;
    for (unsigned x = 0; x < b; ++x)
      cp += printable(x) ? 0 : 1;
  }
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

// The id of the byte token of `b`.
int64_t byte_id(const text::tokenizer& tok, unsigned b) {
  auto id = tok.token_to_id(byte_spelling(b));
  EXPECT_TRUE(id) << "no byte token for " << b;
  return id.value_or(0);
}

std::vector<int64_t> bytes(const text::tokenizer& tok, const std::string& s) {
  std::vector<int64_t> ids;
  for (unsigned char c : s)
    ids.push_back(byte_id(tok, c));
  return ids;
}

// What `push` answers for each of `ids`, in order.
std::vector<std::optional<size_t>> pushes(stop_string_matcher& m, const std::vector<int64_t>& ids) {
  std::vector<std::optional<size_t>> out;
  for (auto id : ids)
    out.push_back(m.push(id));
  return out;
}

const std::optional<size_t> none;

} // namespace

TEST(StopStringMatcher, FindsAStringThatSpansTokensOnceAtTheTokenThatCompletesIt) {
  const auto& tok = tiny_tokenizer();
  stop_string_matcher m(*make_detokenizer(tok), {"bc"});
  EXPECT_EQ(pushes(m, bytes(tok, "abcd")),
            (std::vector<std::optional<size_t>>{none, none, size_t{0}, none}));
  // A string inside one token is found too.
  stop_string_matcher whole(*make_detokenizer(tok), {"the"});
  auto ids = tok.encode(" the", false);
  std::optional<size_t> last;
  for (auto id : ids)
    last = whole.push(id);
  EXPECT_EQ(last, size_t{0});
}

TEST(StopStringMatcher, AMultiByteCharacterSplitOverTokensMatchesWhenItIsComplete) {
  const auto& tok = tiny_tokenizer();
  // "é" is C3 A9; "€" is E2 82 AC: one byte token each.
  stop_string_matcher e(*make_detokenizer(tok), {"xé"});
  EXPECT_EQ(pushes(e, bytes(tok, "xé!")),
            (std::vector<std::optional<size_t>>{none, none, size_t{0}, none}));
  stop_string_matcher euro(*make_detokenizer(tok), {"€"});
  EXPECT_EQ(pushes(euro, bytes(tok, "a€")),
            (std::vector<std::optional<size_t>>{none, none, none, size_t{0}}));
  // "è" (C3 A8) shares its first byte with "é": only the whole character decides.
  stop_string_matcher a(*make_detokenizer(tok), {"é"});
  EXPECT_EQ(pushes(a, bytes(tok, "èé")),
            (std::vector<std::optional<size_t>>{none, none, none, size_t{0}}));
}

TEST(StopStringMatcher, OfSeveralStringsTheOneThatEndsFirstWins) {
  const auto& tok = tiny_tokenizer();
  // A token whose own text has at least three printable ASCII bytes.
  int64_t id = -1;
  std::string word;
  for (int64_t i = 256; i < tok.vocab_size() && id < 0; ++i) {
    auto t = tok.decode({i}, false);
    bool ascii = t.size() >= 3 && !tok.is_special(i);
    for (char c : t)
      ascii = ascii && c > 0x20 && c < 0x7f;
    if (ascii) {
      id = i;
      word = t;
    }
  }
  ASSERT_GE(id, 0) << "the tokenizer has no merged ASCII token";
  // Both complete with the one token; the second listed ends first.
  stop_string_matcher m(*make_detokenizer(tok), {word.substr(1, 2), word.substr(0, 2), "never"});
  EXPECT_EQ(m.push(id), size_t{1}) << word;
  // Equal ends: the one that starts first; then the order given.
  stop_string_matcher starts(*make_detokenizer(tok), {"é", "xé"});
  EXPECT_EQ(pushes(starts, bytes(tok, "xé")),
            (std::vector<std::optional<size_t>>{none, none, size_t{1}}));
  stop_string_matcher same(*make_detokenizer(tok), {"b", "zz", "b"});
  EXPECT_EQ(pushes(same, bytes(tok, "ab")), (std::vector<std::optional<size_t>>{none, size_t{0}}));
  // Across tokens the first token that completes any string stops the row.
  stop_string_matcher later(*make_detokenizer(tok), {"cd", "b"});
  EXPECT_EQ(pushes(later, bytes(tok, "abcd")),
            (std::vector<std::optional<size_t>>{none, size_t{1}, none, size_t{0}}));
}

TEST(StopStringMatcher, KeepsFindingStringsAfterALongText) {
  const auto& tok = tiny_tokenizer();
  stop_string_matcher m(*make_detokenizer(tok), {"q!q", "ab ab ab"});
  std::string text;
  for (int i = 0; i < 800; ++i)
    text += i % 2 ? "a" : "b";
  auto got = pushes(m, bytes(tok, text));
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(got[i], none) << "token " << i;
  EXPECT_EQ(pushes(m, bytes(tok, "q!q")),
            (std::vector<std::optional<size_t>>{none, none, size_t{0}}));
  EXPECT_EQ(pushes(m, bytes(tok, "ab ab ab")).back(), size_t{1});
}

TEST(StopStringMatcher, SpecialTokensAreTextAndIdsThatNameNoTokenAreNot) {
  const auto& tok = tiny_tokenizer();
  auto end = tok.token_to_id(std::string{text::im_end_token});
  ASSERT_TRUE(end);
  stop_string_matcher m(*make_detokenizer(tok), {std::string{text::im_end_token}});
  EXPECT_EQ(m.push(byte_id(tok, 'a')), none);
  EXPECT_EQ(m.push(*end), size_t{0});
  // A model vocabulary padded past its tokenizer: the ids beyond add no text.
  auto files = text::train_model_tokenizer(300);
  auto small = text::tokenizer::from_json(files.tokenizer_json, files.tokenizer_config_json);
  ASSERT_LT(small.vocab_size(), 400);
  stop_string_matcher padded(*make_detokenizer(small), {"ab"});
  EXPECT_EQ(padded.push(byte_id(small, 'a')), none);
  EXPECT_EQ(padded.push(400), none);
  EXPECT_EQ(padded.push(byte_id(small, 'b')), size_t{0});
}

TEST(StopStringMatcher, RefusesNoStringsAndEmptyStrings) {
  const auto& tok = tiny_tokenizer();
  try {
    stop_string_matcher m(*make_detokenizer(tok), {});
    ADD_FAILURE() << "no stop strings accepted";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::invalid_argument);
  }
  try {
    stop_string_matcher m(*make_detokenizer(tok), {"a", ""});
    ADD_FAILURE() << "an empty stop string accepted";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("stop string 1 is empty"), std::string::npos)
        << e.what();
  }
}
