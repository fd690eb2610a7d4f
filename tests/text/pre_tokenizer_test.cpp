// text/hf/pre_tokenizer.hpp: Split (every behavior, invert), ByteLevel, Metaspace (every prepend
// scheme), Sequence, and the refusals.
#include "tests/text/test_support.hpp"
#include "text/hf/pre_tokenizer.hpp"

namespace rlforge::text::test {
namespace {

using nlohmann::json;
using strings = std::vector<std::string>;

strings pieces(const json& j, const std::string& text, bool at_start = true) {
  auto p = hf::make_pre_tokenizer(j, "pre_tokenizer");
  hf::pre_tokenized pt(text, at_start);
  p->pre_tokenize(pt);
  strings out;
  for (const auto& pc : pt.pieces())
    out.emplace_back(pc.text);
  return out;
}

json split(const json& pattern, const char* behavior, bool invert = false) {
  return {{"type", "Split"}, {"pattern", pattern}, {"behavior", behavior}, {"invert", invert}};
}

TEST(PreTokenizer, SplitBehaviors) {
  json space{{"String", " "}};
  const std::string text = "How are you doing?";
  EXPECT_EQ(pieces(split(space, "Removed"), text), (strings{"How", "are", "you", "doing?"}));
  EXPECT_EQ(pieces(split(space, "Isolated"), text),
            (strings{"How", " ", "are", " ", "you", " ", "doing?"}));
  EXPECT_EQ(pieces(split(space, "MergedWithPrevious"), text),
            (strings{"How ", "are ", "you ", "doing?"}));
  EXPECT_EQ(pieces(split(space, "MergedWithNext"), text),
            (strings{"How", " are", " you", " doing?"}));
  json dash{{"String", "-"}};
  EXPECT_EQ(pieces(split(dash, "Contiguous"), "a--b-"), (strings{"a", "--", "b", "-"}));
  EXPECT_EQ(pieces(split(dash, "Isolated"), "a--b-"), (strings{"a", "-", "-", "b", "-"}));
  EXPECT_EQ(pieces(split(dash, "MergedWithPrevious"), "a--b-"), (strings{"a-", "-", "b-"}));
  EXPECT_EQ(pieces(split(dash, "MergedWithNext"), "a--b-"), (strings{"a", "-", "-b", "-"}));
}

TEST(PreTokenizer, SplitInvertKeepsTheMatches) {
  json letters{{"Regex", "\\p{L}+"}};
  EXPECT_EQ(pieces(split(letters, "Removed", true), "ab, cd!"), (strings{"ab", "cd"}));
  EXPECT_EQ(pieces(split(letters, "Isolated", true), "ab, cd!"), (strings{"ab", ", ", "cd", "!"}));
}

TEST(PreTokenizer, ApplyBehaviorOnSpans) {
  std::vector<hf::split_span> spans{{0, 1, false}, {1, 2, true}, {2, 3, true}, {3, 4, false}};
  using ranges = std::vector<std::pair<size_t, size_t>>;
  EXPECT_EQ(hf::apply_behavior(spans, hf::split_behavior::contiguous),
            (ranges{{0, 1}, {1, 3}, {3, 4}}));
  EXPECT_EQ(hf::apply_behavior(spans, hf::split_behavior::removed), (ranges{{0, 1}, {3, 4}}));
}

TEST(PreTokenizer, ByteLevelSplitsLikeGpt2AndMapsBytes) {
  json bl{{"type", "ByteLevel"},
          {"add_prefix_space", false},
          {"trim_offsets", true},
          {"use_regex", true}};
  EXPECT_EQ(pieces(bl, "Hello my friend, how's it going?"),
            (strings{"Hello", "Ġmy", "Ġfriend", ",", "Ġhow", "'s", "Ġit", "Ġgoing", "?"}));
  EXPECT_EQ(pieces(bl, "a\n\nb  c 123"), (strings{"a", "Ċ", "Ċ", "b", "Ġ", "Ġc", "Ġ123"}));
  EXPECT_EQ(pieces(bl, "café"), (strings{"cafÃ©"}));
  bl["add_prefix_space"] = true;
  EXPECT_EQ(pieces(bl, "Hello world"), (strings{"ĠHello", "Ġworld"}));
  EXPECT_EQ(pieces(bl, " Hello"), (strings{"ĠHello"})); // no second space
  bl["use_regex"] = false;
  bl["add_prefix_space"] = false;
  EXPECT_EQ(pieces(bl, "one two\n"), (strings{"oneĠtwoĊ"}));
}

TEST(PreTokenizer, MetaspacePrependSchemes) {
  json ms{
      {"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "always"}, {"split", true}};
  EXPECT_EQ(pieces(ms, "Hey friend"), (strings{"▁Hey", "▁friend"}));
  EXPECT_EQ(pieces(ms, "Hey friend", false), (strings{"▁Hey", "▁friend"}));
  EXPECT_EQ(pieces(ms, "  two"), (strings{"▁", "▁two"}));
  ms["prepend_scheme"] = "first";
  EXPECT_EQ(pieces(ms, "Hey friend", true), (strings{"▁Hey", "▁friend"}));
  EXPECT_EQ(pieces(ms, "Hey friend", false), (strings{"Hey", "▁friend"}));
  ms["prepend_scheme"] = "never";
  EXPECT_EQ(pieces(ms, "Hey friend"), (strings{"Hey", "▁friend"}));
  ms["prepend_scheme"] = "always";
  ms["split"] = false;
  EXPECT_EQ(pieces(ms, "Hey friend"), (strings{"▁Hey▁friend"}));
}

TEST(PreTokenizer, MetaspaceLegacyFields) {
  // add_prefix_space false must come with prepend_scheme never, as HF requires.
  json legacy{{"type", "Metaspace"}, {"replacement", "▁"}, {"add_prefix_space", false}};
  expect_error([&] { hf::make_pre_tokenizer(legacy, "pre_tokenizer"); },
               {"pre_tokenizer.add_prefix_space", "prepend_scheme"});
  legacy["prepend_scheme"] = "never";
  EXPECT_EQ(pieces(legacy, "a b"), (strings{"a", "▁b"}));
  json rep{{"type", "Metaspace"}, {"replacement", "▁"}, {"str_rep", "_"}};
  expect_error([&] { hf::make_pre_tokenizer(rep, "p"); }, {"p.str_rep", "differs"});
  json wide{{"type", "Metaspace"}, {"replacement", "__"}};
  expect_error([&] { hf::make_pre_tokenizer(wide, "p"); }, {"p.replacement", "one character"});
}

TEST(PreTokenizer, SequenceAppliesEachStep) {
  json seq{
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({split({{"Regex", "\\p{N}"}}, "Isolated"),
                    {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  EXPECT_EQ(pieces(seq, "ab 12 c"), (strings{"abĠ", "1", "2", "Ġc"}));
  auto p = hf::make_pre_tokenizer(seq, "p");
  EXPECT_TRUE(p->ends_with_byte_level());
  hf::pre_tokenized raw("ab 12 é", true);
  p->pre_tokenize_unmapped(raw);
  strings unmapped;
  for (const auto& pc : raw.pieces())
    unmapped.emplace_back(pc.text);
  EXPECT_EQ(unmapped, (strings{"ab ", "1", "2", " é"}));
}

TEST(PreTokenizer, RefusesUnsupportedTypesNamingThem) {
  for (const char* type : {"Whitespace", "WhitespaceSplit", "BertPreTokenizer", "Digits",
                           "Punctuation", "UnicodeScripts", "CharDelimiterSplit"})
    expect_error(
        [&] {
          hf::make_pre_tokenizer({{"type", type}}, "f.json: pre_tokenizer");
        },
        {"f.json: pre_tokenizer", std::string("unsupported pre_tokenizer type \"") + type + "\""});
  expect_error(
      [] {
        hf::make_pre_tokenizer(split({{"String", " "}}, "Dropped"), "p");
      },
      {"p.behavior", "\"Dropped\""});
  expect_error(
      [] {
        hf::make_pre_tokenizer(
            {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Removed"}}, "p");
      },
      {"p.invert", "missing"});
}

} // namespace
} // namespace rlforge::text::test
