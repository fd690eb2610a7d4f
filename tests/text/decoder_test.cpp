// text/hf/decoder.hpp: every supported decoder type, the Llama 2 chain, and the refusals.
#include "tests/text/test_support.hpp"
#include "text/hf/decoder.hpp"

namespace rlforge::text::test {
namespace {

using nlohmann::json;
using strings = std::vector<std::string>;

strings chain(const json& j, strings tokens) {
  hf::make_decoder(j, "decoder")->decode_chain(tokens);
  return tokens;
}

const std::string fffd = "\xEF\xBF\xBD";

TEST(Decoder, ByteLevelJoinsBytesIntoText) {
  json bl{{"type", "ByteLevel"},
          {"add_prefix_space", true},
          {"trim_offsets", true},
          {"use_regex", true}};
  EXPECT_EQ(chain(bl, {"Hello", "Ġwor", "ld", "Ċ"}), (strings{"Hello world\n"}));
  // The bytes of "é" split over two tokens still make one character.
  EXPECT_EQ(chain(bl, {"caf", "Ã", "©"}), (strings{"café"}));
  // A token with a character outside the alphabet keeps its own UTF-8 bytes.
  EXPECT_EQ(chain(bl, {"a", "<|x y|>", "Ġb"}), (strings{"a<|x y|> b"}));
  // Bytes that are not UTF-8 become U+FFFD (one per maximal ill-formed subpart).
  EXPECT_EQ(chain(bl, {"a", "æ", "¸"}), (strings{"a" + fffd}));
}

TEST(Decoder, ByteFallbackDecodesRunsOfByteTokens) {
  json bf{{"type", "ByteFallback"}};
  EXPECT_EQ(chain(bf, {"a", "<0xE4>", "<0xB8>", "<0xAD>", "b"}), (strings{"a", "中", "b"}));
  EXPECT_EQ(chain(bf, {"<0x0a>"}), (strings{"\n"})); // either case of hex digit
  // An invalid run becomes one U+FFFD per byte, as HF does.
  EXPECT_EQ(chain(bf, {"<0xE4>", "<0xB8>", "x"}), (strings{fffd, fffd, "x"}));
  EXPECT_EQ(chain(bf, {"<0xZZ>", "<0x41"}), (strings{"<0xZZ>", "<0x41"}));
}

TEST(Decoder, MetaspaceDropsTheFirstReplacementUnlessNever) {
  json ms{
      {"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "always"}, {"split", true}};
  EXPECT_EQ(chain(ms, {"▁Hey", "▁friend", "!"}), (strings{"Hey", " friend", "!"}));
  ms["prepend_scheme"] = "never";
  EXPECT_EQ(chain(ms, {"▁Hey", "▁friend"}), (strings{" Hey", " friend"}));
}

TEST(Decoder, ReplaceFuseStripAndBpeSuffix) {
  EXPECT_EQ(
      chain({{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}}, {"▁a▁b", "c"}),
      (strings{" a b", "c"}));
  EXPECT_EQ(chain({{"type", "Fuse"}}, {"a", "b", "c"}), (strings{"abc"}));
  EXPECT_EQ(chain({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 2}},
                  {"  a  ", " b", "c   "}),
            (strings{" a", "b", "c "}));
  EXPECT_EQ(chain({{"type", "BPEDecoder"}, {"suffix", "</w>"}}, {"hel", "lo</w>", "you</w>"}),
            (strings{"hel", "lo ", "you"}));
}

TEST(Decoder, Llama2Chain) {
  json seq{{"type", "Sequence"},
           {"decoders",
            json::array({{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
                         {{"type", "ByteFallback"}},
                         {{"type", "Fuse"}},
                         {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
  EXPECT_EQ(chain(seq, {"▁Hello", "▁", "<0xE4>", "<0xB8>", "<0xAD>", "▁world"}),
            (strings{"Hello 中 world"}));
}

TEST(Decoder, RefusesUnsupportedTypesAndBadFields) {
  for (const char* type : {"WordPiece", "CTC", "Unknown"})
    expect_error(
        [&] {
          hf::make_decoder({{"type", type}}, "f: decoder");
        },
        {"f: decoder", std::string("unsupported decoder type \"") + type + "\""});
  expect_error(
      [] {
        hf::make_decoder({{"type", "Strip"}, {"content", "ab"}, {"start", 1}, {"stop", 0}}, "d");
      },
      {"d.content", "one character"});
  expect_error(
      [] {
        hf::make_decoder({{"type", "Strip"}, {"content", " "}, {"start", -1}, {"stop", 0}}, "d");
      },
      {"d.start", "out of range"});
  expect_error(
      [] {
        hf::make_decoder({{"type", "Fuse"}, {"sep", " "}}, "d");
      },
      {"d.sep", "unknown field"});
}

} // namespace
} // namespace rlforge::text::test
