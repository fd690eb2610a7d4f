// text/hf/post_processor.hpp: TemplateProcessing (object and string forms), ByteLevel, Sequence,
// and the refusals.
#include "tests/text/test_support.hpp"
#include "text/hf/post_processor.hpp"

namespace rlforge::text::test {
namespace {

using nlohmann::json;
using ids = std::vector<int32_t>;

ids process(const json& j, ids in, bool add_special) {
  hf::make_post_processor(j, "post_processor")->process(in, add_special);
  return in;
}

json special(const std::string& name, const std::vector<int>& token_ids) {
  return {{"id", name},
          {"ids", token_ids},
          {"tokens", std::vector<std::string>(token_ids.size(), name)}};
}

json bos_eos_template() {
  auto piece = [](const char* name) {
    return json{{"SpecialToken", {{"id", name}, {"type_id", 0}}}};
  };
  auto seq = [](const char* id, int type) {
    return json{{"Sequence", {{"id", id}, {"type_id", type}}}};
  };
  return {{"type", "TemplateProcessing"},
          {"single", json::array({piece("<s>"), seq("A", 0), piece("</s>")})},
          {"pair", json::array({piece("<s>"), seq("A", 0), seq("B", 1), piece("</s>")})},
          {"special_tokens", {{"<s>", special("<s>", {1})}, {"</s>", special("</s>", {2})}}}};
}

TEST(PostProcessor, TemplateAddsItsTokensOnlyWithSpecialTokens) {
  EXPECT_EQ(process(bos_eos_template(), {7, 8}, true), (ids{1, 7, 8, 2}));
  EXPECT_EQ(process(bos_eos_template(), {7, 8}, false), (ids{7, 8}));
  EXPECT_EQ(process(bos_eos_template(), {}, true), (ids{1, 2}));
}

TEST(PostProcessor, TemplateStringFormAndMultiIdTokens) {
  json t{
      {"type", "TemplateProcessing"},
      {"single", "[CLS] $A [SEP]:0"},
      {"pair", "[CLS] $A:0 [SEP] $B:1 [SEP]:1"},
      {"special_tokens", {{"[CLS]", special("[CLS]", {5, 6})}, {"[SEP]", special("[SEP]", {9})}}}};
  EXPECT_EQ(process(t, {3}, true), (ids{5, 6, 3, 9}));
}

TEST(PostProcessor, ByteLevelKeepsIdsAndSequenceChains) {
  json bl{{"type", "ByteLevel"},
          {"add_prefix_space", true},
          {"trim_offsets", false},
          {"use_regex", true}};
  EXPECT_EQ(process(bl, {4, 5}, true), (ids{4, 5}));
  json seq{{"type", "Sequence"}, {"processors", json::array({bl, bos_eos_template()})}};
  EXPECT_EQ(process(seq, {4}, true), (ids{1, 4, 2}));
  EXPECT_EQ(process(seq, {4}, false), (ids{4}));
}

TEST(PostProcessor, RefusesBrokenTemplates) {
  json missing = bos_eos_template();
  missing["special_tokens"].erase("</s>");
  expect_error([&] { hf::make_post_processor(missing, "p"); },
               {"p", "special token \"</s>\" missing from special_tokens"});
  json uses_b = bos_eos_template();
  uses_b["single"] = "$A $B";
  expect_error([&] { hf::make_post_processor(uses_b, "p"); }, {"p.single", "uses $B"});
  json no_a = bos_eos_template();
  no_a["single"] = "<s>";
  expect_error([&] { hf::make_post_processor(no_a, "p"); }, {"p.single", "does not contain $A"});
  json bad_piece = bos_eos_template();
  bad_piece["single"] = json::array({{{"Token", {{"id", "<s>"}}}}});
  expect_error([&] { hf::make_post_processor(bad_piece, "p"); }, {"p.single[0]", "\"Token\""});
  json bad_seq = bos_eos_template();
  bad_seq["single"][1]["Sequence"]["id"] = "C";
  expect_error([&] { hf::make_post_processor(bad_seq, "p"); },
               {"p.single[1].Sequence.id", "\"C\""});
}

TEST(PostProcessor, RefusesUnsupportedTypesNamingThem) {
  for (const char* type : {"BertProcessing", "RobertaProcessing", "Whatever"})
    expect_error(
        [&] {
          hf::make_post_processor({{"type", type}}, "tok.json: post_processor");
        },
        {"tok.json: post_processor",
         std::string("unsupported post_processor type \"") + type + "\""});
}

} // namespace
} // namespace rlforge::text::test
