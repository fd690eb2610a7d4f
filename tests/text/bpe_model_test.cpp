// text/hf/bpe_model.hpp: merge order, both merge formats, byte_fallback, unk and fuse_unk,
// ignore_merges, subword prefix and end-of-word suffix, the raw-byte path, and the refusals.
#include <random>

#include "tests/text/test_support.hpp"
#include "text/hf/bpe_model.hpp"

namespace rlforge::text::test {
namespace {

using nlohmann::json;

std::vector<int32_t> encode(const hf::bpe_model& m, const std::string& word) {
  std::vector<int32_t> out;
  m.tokenize(word, out);
  return out;
}

std::string spelled(const hf::bpe_model& m, const std::vector<int32_t>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i)
    out += (i ? "|" : "") + *m.id_to_token(ids[i]);
  return out;
}

std::unique_ptr<const hf::bpe_model> model(const json& j) {
  return hf::bpe_model::from_json(j, "model");
}

TEST(BpeModel, LowestRankMergesFirst) {
  // "b c" outranks "a b": abc is a|bc, not ab|c.
  auto m = model(bpe_json({"a", "b", "c", "bc", "ab", "abc"}, {"b c", "a b"}));
  EXPECT_EQ(spelled(*m, encode(*m, "abc")), "a|bc");
  auto n = model(bpe_json({"a", "b", "c", "bc", "ab", "abc"}, {"a b", "b c", "ab c"}));
  EXPECT_EQ(spelled(*n, encode(*n, "abc")), "abc");
  EXPECT_EQ(spelled(*n, encode(*n, "cab")), "c|ab");
}

TEST(BpeModel, EqualRanksMergeLeftmostFirst) {
  auto m = model(bpe_json({"a", "aa"}, {"a a"}));
  EXPECT_EQ(spelled(*m, encode(*m, "aaa")), "aa|a");
  EXPECT_EQ(spelled(*m, encode(*m, "aaaaa")), "aa|aa|a");
}

TEST(BpeModel, LongWordsMergeAsShortOnes) {
  // Past 64 symbols the model merges with a heap instead of scanning: same rules, checked here
  // against results computed by hand for the repeated patterns.
  auto m = model(bpe_json({"a", "b", "c", "bc", "ab", "abab"}, {"b c", "a b", "ab ab"}));
  std::string abc, ab;
  for (int i = 0; i < 40; ++i)
    abc += "abc";
  for (int i = 0; i < 50; ++i)
    ab += "ab";
  auto ids = encode(*m, abc); // 120 symbols
  ASSERT_EQ(ids.size(), 80u);
  for (size_t i = 0; i < ids.size(); i += 2) {
    EXPECT_EQ(*m->id_to_token(ids[i]), "a");
    EXPECT_EQ(*m->id_to_token(ids[i + 1]), "bc");
  }
  ids = encode(*m, ab); // 100 symbols -> 25 abab
  ASSERT_EQ(ids.size(), 25u);
  for (int32_t id : ids)
    EXPECT_EQ(*m->id_to_token(id), "abab");
  ids = encode(*m, ab.substr(0, 20)); // 20 symbols, the scanning path
  EXPECT_EQ(ids.size(), 5u);
}

TEST(BpeModel, BothMergeFormatsAreTheSame) {
  json strings = bpe_json({"h", "e", "l", "o", "he", "ll", "hell", "hello"},
                          {"h e", "l l", "he ll", "hell o"});
  json pairs = strings;
  pairs["merges"] = json::array({{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}});
  auto a = model(strings);
  auto b = model(pairs);
  EXPECT_EQ(encode(*a, "hello"), encode(*b, "hello"));
  EXPECT_EQ(spelled(*a, encode(*a, "hello")), "hello");
  EXPECT_EQ(spelled(*a, encode(*a, "hell")), "hell");
  // Pairs may hold spaces, which the string form cannot.
  json spaced = bpe_json({"a", " ", "a "}, {});
  spaced["merges"] = json::array({{"a", " "}});
  auto c = model(spaced);
  EXPECT_EQ(spelled(*c, encode(*c, "a ")), "a ");
}

TEST(BpeModel, ByteFallbackForUnknownCharacters) {
  std::vector<std::string> tokens{"<unk>", "a", "b"};
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    tokens.emplace_back(hex);
  }
  auto m = model(bpe_json(tokens, {}, {{"byte_fallback", true}, {"unk_token", "<unk>"}}));
  EXPECT_EQ(spelled(*m, encode(*m, "a中b")), "a|<0xE4>|<0xB8>|<0xAD>|b");
  // Without byte tokens in the vocabulary the character is unknown.
  auto n = model(
      bpe_json({"<unk>", "a", "<0xE4>"}, {}, {{"byte_fallback", true}, {"unk_token", "<unk>"}}));
  EXPECT_EQ(spelled(*n, encode(*n, "a中")), "a|<unk>");
}

TEST(BpeModel, UnknownsFuseOnlyWithFuseUnk) {
  json j = bpe_json({"<unk>", "a"}, {}, {{"unk_token", "<unk>"}});
  auto m = model(j);
  EXPECT_EQ(spelled(*m, encode(*m, "axya")), "a|<unk>|<unk>|a");
  j["fuse_unk"] = true;
  auto f = model(j);
  EXPECT_EQ(spelled(*f, encode(*f, "axya")), "a|<unk>|a");
  // With no unk_token, HF drops what it cannot encode.
  auto d = model(bpe_json({"a"}, {}));
  EXPECT_EQ(spelled(*d, encode(*d, "xax")), "a");
}

TEST(BpeModel, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
  // "abc" is in the vocabulary but no merge builds it.
  json j = bpe_json({"a", "b", "c", "ab", "abc"}, {"a b"});
  EXPECT_EQ(spelled(*model(j), encode(*model(j), "abc")), "ab|c");
  j["ignore_merges"] = true;
  auto m = model(j);
  EXPECT_EQ(spelled(*m, encode(*m, "abc")), "abc");
  EXPECT_EQ(spelled(*m, encode(*m, "abcab")), "ab|c|ab");
}

TEST(BpeModel, SubwordPrefixAndWordSuffix) {
  auto p = model(bpe_json({"a", "##b", "##c", "ab", "##bc"}, {"##b ##c", "a ##b"},
                          {{"continuing_subword_prefix", "##"}}));
  EXPECT_EQ(spelled(*p, encode(*p, "abc")), "a|##bc");
  EXPECT_EQ(spelled(*p, encode(*p, "ab")), "ab");
  auto s =
      model(bpe_json({"a", "b", "b</w>", "ab</w>"}, {"a b</w>"}, {{"end_of_word_suffix", "</w>"}}));
  EXPECT_EQ(spelled(*s, encode(*s, "ab")), "ab</w>");
  EXPECT_EQ(spelled(*s, encode(*s, "ba")), "b"); // "a</w>" is not in the vocabulary: dropped
}

TEST(BpeModel, RawBytesGiveTheSameIdsAsTheByteLevelSpelling) {
  std::vector<std::string> tokens = byte_alphabet();
  std::vector<std::string> merges;
  auto add = [&](const std::string& a, const std::string& b) {
    tokens.push_back(a + b);
    merges.push_back(a + " " + b);
  };
  add("Ġ", "t");
  add("h", "e");
  add("Ġt", "he");
  add("Ã", "©");
  add("a", "a");
  for (bool ignore : {false, true}) {
    json j = bpe_json(tokens, merges, {{"ignore_merges", ignore}});
    auto m = model(j);
    ASSERT_TRUE(m->reads_raw_bytes());
    std::mt19937 rng(7);
    const std::vector<std::string> parts{" the", "é", "aaa", "x", "\n", "中", " t", "he"};
    for (int k = 0; k < 300; ++k) {
      std::string raw;
      for (int n = rng() % 30; n > 0; --n)
        raw += parts[rng() % parts.size()];
      std::string spelled_raw;
      unicode::append_byte_level(spelled_raw, raw);
      std::vector<int32_t> a, b;
      m->tokenize_raw(raw, a);
      m->tokenize(spelled_raw, b);
      EXPECT_EQ(a, b) << raw;
    }
  }
  // A model missing a byte character cannot read raw bytes.
  std::vector<std::string> partial(tokens.begin() + 1, tokens.begin() + 256);
  EXPECT_FALSE(model(bpe_json(partial, {}))->reads_raw_bytes());
}

TEST(BpeModel, RefusesMalformedModels) {
  expect_error(
      [] {
        model(bpe_json({"a", "b"}, {"a b c"}));
      },
      {"model.merges[0]", "\"a b c\"", "not two tokens"});
  expect_error(
      [] {
        model(bpe_json({"a", "b"}, {"a x"}));
      },
      {"model.merges[0]", "\"x\" is not in the vocabulary"});
  expect_error(
      [] {
        model(bpe_json({"a", "b"}, {"a b"}));
      },
      {"model.merges[0]", "merged token \"ab\" is not in the vocabulary"});
  json mixed = bpe_json({"a", "b", "ab"}, {"a b"});
  mixed["merges"].push_back(json::array({"a", "b"}));
  expect_error([&] { model(mixed); }, {"model.merges[1]", "like the first merge"});
  json dup{{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 0}}}, {"merges", json::array()}};
  expect_error([&] { model(dup); }, {"model.vocab", "id 0 is given to both"});
  json neg{{"type", "BPE"}, {"vocab", {{"a", -1}}}, {"merges", json::array()}};
  expect_error([&] { model(neg); }, {"model.vocab.a", "expected an id"});
  expect_error(
      [] {
        model(bpe_json({"a"}, {}, {{"unk_token", "<unk>"}}));
      },
      {"model.unk_token", "\"<unk>\" is not in the vocabulary"});
  expect_error(
      [] {
        model(bpe_json({"a"}, {}, {{"dropout", 0.1}}));
      },
      {"model.dropout", "not supported"});
  EXPECT_NO_THROW(model(bpe_json({"a"}, {}, {{"dropout", 0.0}})));
  expect_error(
      [] {
        model(bpe_json({"a"}, {}, {{"cache_capacity", 10}}));
      },
      {"model.cache_capacity", "unknown field"});
  for (const char* type : {"WordPiece", "Unigram", "WordLevel"})
    expect_error(
        [&] {
          model({{"type", type}, {"vocab", json::object()}});
        },
        {"model.type", std::string("unsupported model type \"") + type + "\""});
  expect_error(
      [] {
        model({{"type", "BPE"}, {"vocab", json::object()}});
      },
      {"model.merges", "missing"});
}

} // namespace
} // namespace rlforge::text::test
