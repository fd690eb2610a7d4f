// text/bpe_trainer.hpp: what the trainer learns, the files it writes, and its refusals.
#include "tests/text/test_support.hpp"
#include "text/bpe_trainer.hpp"
#include "text/tokenizer.hpp"

namespace rlforge::text::test {
namespace {

using nlohmann::json;

std::string corpus() {
  std::string out;
  for (int i = 0; i < 60; ++i)
    out += "hello world, the tokenizer says hello to " + std::to_string(i * 37) +
           " friends.\nDon't stop: 数据 模型 数据 🙂 café\n<|endoftext|>";
  return out;
}

TEST(BpeTrainer, LearnsFrequentWordsAndRoundTrips) {
  bpe_trainer_options o;
  o.vocab_size = 300;
  auto files = train_bpe(corpus(), o);
  auto tok = tokenizer::from_json(files.tokenizer_json, files.tokenizer_config_json);
  EXPECT_EQ(tok.vocab_size(), 300);
  // The special tokens come last, in order.
  EXPECT_EQ(tok.token_to_id("<|endoftext|>"), 297);
  EXPECT_EQ(tok.token_to_id("<|im_start|>"), 298);
  EXPECT_EQ(tok.token_to_id("<|im_end|>"), 299);
  EXPECT_TRUE(tok.is_special(297));
  ASSERT_TRUE(tok.eos_token());
  EXPECT_EQ(tok.eos_token()->id, 297);
  ASSERT_TRUE(tok.pad_token());
  EXPECT_EQ(tok.pad_token()->id, 297);
  EXPECT_FALSE(tok.bos_token());
  // Frequent words became single tokens.
  EXPECT_EQ(tok.encode(" hello", false).size(), 1u);
  EXPECT_EQ(tok.encode(" tokenizer", false).size(), 1u);
  // Digits stay single (Qwen2's split) and the special token never entered the merges.
  EXPECT_EQ(tok.encode("2024", false).size(), 4u);
  for (int64_t id = 0; id < 297; ++id)
    EXPECT_EQ(tok.id_to_token(id)->find("endoftext"), std::string::npos);
  // Byte-level: anything round-trips, in NFC.
  for (std::string text : {"never seen: Ωμέγα 😀 \t\r\n", "e\xCC\x81", "<|im_start|>x<|im_end|>"}) {
    std::string expected = text == "e\xCC\x81" ? "é" : text;
    EXPECT_EQ(tok.decode(tok.encode(text, true)), expected);
  }
}

TEST(BpeTrainer, IsDeterministic) {
  bpe_trainer_options o;
  o.vocab_size = 310;
  auto a = train_bpe(corpus(), o);
  auto b = train_bpe(corpus(), o);
  EXPECT_EQ(a.tokenizer_json, b.tokenizer_json);
  EXPECT_EQ(a.tokenizer_config_json, b.tokenizer_config_json);
}

TEST(BpeTrainer, StopsWhenNoPairIsFrequentEnough) {
  bpe_trainer_options o;
  o.vocab_size = 5000;
  o.min_frequency = 2;
  auto files = train_bpe("abcabc xyz", o);
  auto tok = tokenizer::from_json(files.tokenizer_json);
  // "ab" and "bc" (twice each) can merge; then "abc" twice; nothing else repeats.
  EXPECT_LT(tok.vocab_size(), 270);
  EXPECT_EQ(spell(tok, tok.encode("abcabc", false)), "abc|abc");
  EXPECT_EQ(spell(tok, tok.encode("xyz", false)), "x|y|z");
}

TEST(BpeTrainer, PrependsBosWhenAsked) {
  bpe_trainer_options o;
  o.vocab_size = 300;
  o.special_tokens = {"<bos>", "<eos>"};
  o.bos_token = "<bos>";
  o.eos_token = "<eos>";
  o.pad_token.reset();
  o.add_bos_token = true;
  auto files = train_bpe(corpus(), o);
  auto tok = tokenizer::from_json(files.tokenizer_json, files.tokenizer_config_json);
  auto ids = tok.encode("hello", true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), *tok.token_to_id("<bos>"));
  EXPECT_EQ(tok.encode("hello", false).front(), ids[1]);
  EXPECT_EQ(tok.decode(ids, true), "hello");
  ASSERT_TRUE(tok.bos_token());
  EXPECT_EQ(tok.bos_token()->content, "<bos>");
  EXPECT_FALSE(tok.pad_token());
  auto config = json::parse(files.tokenizer_config_json);
  EXPECT_EQ(config["bos_token"], "<bos>");
  EXPECT_TRUE(config["pad_token"].is_null());
}

TEST(BpeTrainer, StoresTheChatTemplateOnlyWhenGiven) {
  bpe_trainer_options o;
  o.vocab_size = 300;
  EXPECT_FALSE(json::parse(train_bpe(corpus(), o).tokenizer_config_json).contains("chat_template"));
  o.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}";
  auto config = json::parse(train_bpe(corpus(), o).tokenizer_config_json);
  EXPECT_EQ(config["chat_template"], *o.chat_template);
  o.chat_template = "bad \xFF";
  expect_error([&] { train_bpe(corpus(), o); }, {"chat_template", "invalid UTF-8"});
}

TEST(BpeTrainer, WritesLoadableFiles) {
  temp_dir dir;
  bpe_trainer_options o;
  auto files = train_bpe(corpus(), o);
  auto target = dir.path() / "nested" / "tiny";
  write_tokenizer_files(target, files);
  EXPECT_EQ(read_file(target / "tokenizer.json"), files.tokenizer_json);
  EXPECT_EQ(read_file(target / "tokenizer_config.json"), files.tokenizer_config_json);
  EXPECT_FALSE(std::filesystem::exists(target / "tokenizer.json.tmp"));
  auto tok = tokenizer::load(target);
  EXPECT_LE(tok.vocab_size(), 512);
  write_file(dir.path() / "plain-file", "x");
  expect_error([&] { write_tokenizer_files(dir.path() / "plain-file", files); },
               {"plain-file", "cannot be created"});
}

TEST(BpeTrainer, RefusesBadOptions) {
  auto with = [](auto change) {
    bpe_trainer_options o;
    change(o);
    return o;
  };
  auto small = with([](bpe_trainer_options& o) { o.vocab_size = 258; });
  expect_error([&] { train_bpe("abc", small); }, {"vocab_size 258", "256 byte tokens plus 3"});
  auto stray_bos = with([](bpe_trainer_options& o) { o.bos_token = "<s>"; });
  expect_error([&] { train_bpe("abc", stray_bos); }, {"\"<s>\" is not one of the special tokens"});
  auto bos_missing = with([](bpe_trainer_options& o) { o.add_bos_token = true; });
  expect_error([&] { train_bpe("abc", bos_missing); }, {"add_bos_token needs a bos_token"});
  auto twice = with([](bpe_trainer_options& o) {
    o.special_tokens = {"<a>", "<a>"};
    o.eos_token.reset();
    o.pad_token.reset();
  });
  expect_error([&] { train_bpe("abc", twice); }, {"\"<a>\" is listed twice"});
  auto empty = with([](bpe_trainer_options& o) {
    o.special_tokens = {""};
    o.eos_token.reset();
    o.pad_token.reset();
  });
  expect_error([&] { train_bpe("abc", empty); }, {"special token is empty"});
  expect_error([] { train_bpe("ab\xC0", {}); }, {"train_bpe: corpus", "invalid UTF-8 at byte 2"});
}

} // namespace
} // namespace rlforge::text::test
