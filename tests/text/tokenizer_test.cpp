// text/tokenizer.hpp: loading model directories, special tokens from tokenizer_config.json, whole
// pipelines (byte-level, Llama 2 style, Metaspace), errors, and concurrent use.
#include <thread>

#include "tests/text/test_support.hpp"
#include "text/tokenizer.hpp"

namespace rlforge::text::test {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

TEST(Tokenizer, ByteLevelRoundTripsAnyText) {
  auto tok = tokenizer::from_json(gpt2_like());
  EXPECT_EQ(spell(tok, tok.encode("the world", false)), "t|he|Ġwor|l|d");
  EXPECT_EQ(spell(tok, tok.encode(" the world", false)), "Ġthe|Ġwor|l|d");
  for (std::string text :
       {"", "x", "é中😀 👨‍👩‍👧 \t\r\n  ", "a<|endoftext|>b", "\xEF\xBF\xBD \x01"}) {
    auto ids = tok.encode(text, true);
    EXPECT_EQ(tok.decode(ids), text);
  }
  auto ids = tok.encode("a<|endoftext|>b", false);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[1], 262);
  EXPECT_EQ(tok.decode(ids, true), "ab");
  EXPECT_EQ(tok.vocab_size(), 263);
  EXPECT_EQ(tok.token_to_id("Ġthe"), 258);
  EXPECT_EQ(tok.id_to_token(258), "Ġthe");
  EXPECT_EQ(tok.token_to_id("nope"), std::nullopt);
  EXPECT_EQ(tok.id_to_token(263), std::nullopt);
  EXPECT_EQ(tok.id_to_token(-1), std::nullopt);
  EXPECT_TRUE(tok.is_special(262));
  EXPECT_FALSE(tok.is_special(258));
}

TEST(Tokenizer, Llama2StylePipeline) {
  auto tok = tokenizer::from_json(llama2_like());
  EXPECT_EQ(spell(tok, tok.encode("Hi there world", true)), "<s>|▁Hi|▁there|▁world");
  EXPECT_EQ(spell(tok, tok.encode("Hi there world", false)), "▁Hi|▁there|▁world");
  // Characters outside the vocabulary fall back to bytes, which decode back.
  EXPECT_EQ(spell(tok, tok.encode("Hi 中", false)), "▁Hi|▁|<0xE4>|<0xB8>|<0xAD>");
  EXPECT_EQ(tok.decode(tok.encode("Hi 中 world", true), true), "Hi 中 world");
  EXPECT_EQ(tok.decode(tok.encode("Hi there", true), false), "<s> Hi there");
  // Each section between added tokens is normalized on its own: "▁" is prepended to each.
  EXPECT_EQ(spell(tok, tok.encode("Hi</s>there", false)), "▁Hi|</s>|▁there");
  EXPECT_EQ(tok.encode("", true), (std::vector<int64_t>{1}));
}

TEST(Tokenizer, MetaspaceFirstSchemePrependsOnlyAtTheStart) {
  json ms{
      {"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "first"}, {"split", false}};
  auto tok = tokenizer::from_json(llama2_like(ms, nullptr));
  EXPECT_EQ(spell(tok, tok.encode("Hi there", false)), "▁Hi|▁there");
  // After an added token the text no longer starts the input: no "▁" is prepended.
  EXPECT_EQ(spell(tok, tok.encode("<s>Hi", false)), "<s>|H|i");
  ms["prepend_scheme"] = "always";
  auto always = tokenizer::from_json(llama2_like(ms, nullptr));
  EXPECT_EQ(spell(always, always.encode("<s>Hi", false)), "<s>|▁Hi");
}

TEST(Tokenizer, LoadsADirectoryWithItsSpecialTokens) {
  temp_dir dir;
  write_file(dir.path() / "tokenizer.json", gpt2_like());
  write_file(dir.path() / "tokenizer_config.json",
             R"({"bos_token": {"__type": "AddedToken", "content": "<|endoftext|>"},
                 "eos_token": "<|endoftext|>", "pad_token": null, "chat_template": "{{x}}"})");
  auto tok = tokenizer::load(dir.path());
  ASSERT_TRUE(tok.bos_token());
  EXPECT_EQ(tok.bos_token()->content, "<|endoftext|>");
  EXPECT_EQ(tok.bos_token()->id, 262);
  ASSERT_TRUE(tok.eos_token());
  EXPECT_EQ(tok.eos_token()->id, 262);
  EXPECT_FALSE(tok.pad_token());
  EXPECT_FALSE(tok.unk_token());
  EXPECT_NE(tok.describe().find("tokenizer.json"), std::string::npos);
  // Without tokenizer_config.json there are no named special tokens.
  fs::remove(dir.path() / "tokenizer_config.json");
  EXPECT_FALSE(tokenizer::load(dir.path()).eos_token());
}

TEST(Tokenizer, RefusesMissingAndMalformedFiles) {
  temp_dir dir;
  expect_error([&] { tokenizer::load(dir.path() / "absent"); }, {"absent", "not a directory"});
  expect_error([&] { tokenizer::load(dir.path()); },
               {dir.path().string(), "neither tokenizer.json nor tokenizer.model"});
  write_file(dir.path() / "tokenizer.json", "{\"version\": \"1.0\", \"model\": {");
  expect_error([&] { tokenizer::load(dir.path()); },
               {(dir.path() / "tokenizer.json").string(), "malformed JSON"});
  write_file(dir.path() / "tokenizer.json", "[1, 2]");
  expect_error([&] { tokenizer::load(dir.path()); }, {"tokenizer.json", "expected an object"});
  auto unsupported = json::parse(gpt2_like());
  unsupported["decoder"] = {{"type", "WordPiece"}, {"prefix", "##"}};
  write_file(dir.path() / "tokenizer.json", unsupported.dump());
  expect_error([&] { tokenizer::load(dir.path()); },
               {(dir.path() / "tokenizer.json").string() + ".decoder",
                "unsupported decoder type \"WordPiece\""});
  write_file(dir.path() / "tokenizer.json", gpt2_like());
  write_file(dir.path() / "tokenizer_config.json", R"({"eos_token": "</s>"})");
  expect_error([&] { tokenizer::load(dir.path()); },
               {"tokenizer_config.json", "eos_token \"</s>\" is not in the vocabulary"});
  write_file(dir.path() / "tokenizer_config.json", R"({"eos_token": 7})");
  expect_error([&] { tokenizer::load(dir.path()); },
               {"tokenizer_config.json.eos_token", "expected a string"});
  write_file(dir.path() / "tokenizer_config.json", R"({"add_bos_token": "yes"})");
  expect_error([&] { tokenizer::load(dir.path()); },
               {"tokenizer_config.json.add_bos_token", "expected a boolean"});
}

TEST(Tokenizer, RefusesSettingsItDoesNotApply) {
  auto doc = json::parse(gpt2_like());
  auto with = [&](const char* key, const json& value) {
    json d = doc;
    d[key] = value;
    return d.dump();
  };
  expect_error(
      [&] {
        tokenizer::from_json(with("truncation", {{"max_length", 8}}), {}, "t.json");
      },
      {"t.json.truncation", "is set"});
  expect_error(
      [&] {
        tokenizer::from_json(with("padding", {{"strategy", "BatchLongest"}}), {}, "t.json");
      },
      {"t.json.padding", "is set"});
  expect_error([&] { tokenizer::from_json(with("version", "2.0"), {}, "t.json"); },
               {"t.json.version", "\"2.0\""});
  expect_error([&] { tokenizer::from_json(with("extra", 1), {}, "t.json"); },
               {"t.json.extra", "unknown field"});
  expect_error([&] { tokenizer::from_json(with("model", nullptr), {}, "t.json"); },
               {"t.json.model", "missing"});
  expect_error(
      [&] {
        tokenizer::from_json(with("pre_tokenizer", {{"type", "Whitespace"}}), {}, "t.json");
      },
      {"t.json.pre_tokenizer", "unsupported pre_tokenizer type \"Whitespace\""});
  json bad_template{
      {"type", "TemplateProcessing"},
      {"single", "<x> $A"},
      {"pair", "$A $B"},
      {"special_tokens", {{"<x>", {{"id", "<x>"}, {"ids", {9999}}, {"tokens", {"<x>"}}}}}}};
  expect_error([&] { tokenizer::from_json(with("post_processor", bad_template), {}, "t.json"); },
               {"t.json.post_processor", "adds id 9999"});
}

TEST(Tokenizer, RefusesInvalidTextAndIds) {
  auto tok = tokenizer::from_json(gpt2_like());
  expect_error([&] { tok.encode("ok\xC3(", true); }, {"encode", "invalid UTF-8 at byte 2"});
  expect_error([&] { tok.decode({1, 263}); }, {"decode", "token id 263", "position 1", "outside"});
  expect_error([&] { tok.decode({-5}); }, {"token id -5"});
  // An id inside the range that names no token (a gap in the file's ids).
  auto gap = json::parse(gpt2_like());
  gap["added_tokens"][0]["id"] = 300;
  auto gapped = tokenizer::from_json(gap.dump());
  EXPECT_EQ(gapped.vocab_size(), 301);
  expect_error([&] { gapped.decode({270}); }, {"token id 270", "names no token"});
}

TEST(Tokenizer, CopiesShareTheModelAndThreadsShareCopies) {
  std::optional<tokenizer> original = tokenizer::from_json(gpt2_like());
  tokenizer copy = *original;
  original.reset();
  std::vector<std::string> texts;
  for (int i = 0; i < 50; ++i)
    texts.push_back("the world " + std::to_string(i * 7919) + " é中😀 <|endoftext|> wor" +
                    std::string(static_cast<size_t>(i), 'x'));
  std::vector<std::vector<int64_t>> expected;
  for (const auto& t : texts)
    expected.push_back(copy.encode(t, true));
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round)
        for (size_t i = 0; i < texts.size(); ++i) {
          auto ids = copy.encode(texts[(i + t) % texts.size()], true);
          mismatches[t] += ids != expected[(i + t) % texts.size()];
          mismatches[t] += copy.decode(ids) != texts[(i + t) % texts.size()];
        }
    });
  for (auto& th : threads)
    th.join();
  for (int m : mismatches)
    EXPECT_EQ(m, 0);
}

} // namespace
} // namespace rlforge::text::test
