// text/sentencepiece_tokenizer.hpp: a directory with only tokenizer.model (Llama 2 style), with a
// model trained here by libsentencepiece's trainer.
#include <sentencepiece_trainer.h>

#include "tests/text/test_support.hpp"
#include "text/tokenizer.hpp"

namespace rlforge::text::test {
namespace {

namespace fs = std::filesystem;

// Trains a small BPE model with byte fallback (256 byte pieces, so 400 pieces in all) into
// dir/tokenizer.model; returns an empty string or SentencePiece's error.
std::string train(const fs::path& dir) {
  std::string corpus;
  const char* lines[] = {
      "the tokenizer reads every line of this small corpus",
      "hello world, hello tokenizer, hello again",
      "numbers like 12 and 345 appear here and there",
      "a quick test of the sentencepiece trainer with byte fallback",
      "words repeat so that merges have something to learn from",
  };
  for (int r = 0; r < 40; ++r)
    for (const char* l : lines)
      corpus += std::string(l) + "\n";
  write_file(dir / "corpus.txt", corpus);
  auto status = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + (dir / "corpus.txt").string() +
      " --model_prefix=" + (dir / "tokenizer").string() +
      " --vocab_size=400 --model_type=bpe --character_coverage=1.0 --byte_fallback=true"
      " --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1 --minloglevel=2");
  if (!status.ok())
    return status.ToString();
  fs::remove(dir / "tokenizer.vocab");
  fs::remove(dir / "corpus.txt");
  return "";
}

class SentencePiece : public ::testing::Test {
protected:
  void SetUp() override {
    // libsentencepiece's trainer is linked in, so a model that cannot be trained is a failure.
    std::string error = train(dir_.path());
    ASSERT_EQ(error, "") << "the SentencePiece trainer could not build the test model";
  }
  temp_dir dir_;
};

TEST_F(SentencePiece, LoadsTokenizerModelWhenThereIsNoTokenizerJson) {
  auto tok = tokenizer::load(dir_.path());
  EXPECT_NE(tok.describe().find("sentencepiece"), std::string::npos);
  EXPECT_EQ(tok.vocab_size(), 400);
  ASSERT_TRUE(tok.bos_token());
  EXPECT_EQ(tok.bos_token()->content, "<s>");
  EXPECT_EQ(tok.bos_token()->id, 1);
  ASSERT_TRUE(tok.eos_token());
  EXPECT_EQ(tok.eos_token()->id, 2);
  ASSERT_TRUE(tok.unk_token());
  EXPECT_EQ(tok.unk_token()->id, 0);
  EXPECT_FALSE(tok.pad_token());
  EXPECT_EQ(tok.token_to_id("<s>"), 1);
  EXPECT_EQ(tok.token_to_id("no-such-piece"), std::nullopt);
  EXPECT_TRUE(tok.is_special(1));
  EXPECT_TRUE(tok.is_special(0));
}

TEST_F(SentencePiece, EncodesWithBosAndDecodesBack) {
  auto tok = tokenizer::load(dir_.path());
  auto ids = tok.encode("hello world", true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(tok.encode("hello world", false), std::vector<int64_t>(ids.begin() + 1, ids.end()));
  EXPECT_EQ(tok.decode(ids, true), "hello world");
  EXPECT_EQ(tok.decode(ids, false), "<s>hello world");
  // Characters the model never saw go through its byte pieces and come back.
  auto cjk = tok.encode("中文 ok", false);
  EXPECT_EQ(tok.decode(cjk), "中文 ok");
  expect_error([&] { tok.encode("\xFF", true); }, {"invalid UTF-8"});
  expect_error([&] { tok.decode({400}); }, {"token id 400", "outside"});
}

TEST_F(SentencePiece, ConfigChoosesBosAndEos) {
  write_file(dir_.path() / "tokenizer_config.json",
             R"({"add_bos_token": false, "add_eos_token": true, "pad_token": "</s>"})");
  auto tok = tokenizer::load(dir_.path());
  auto ids = tok.encode("hello", true);
  ASSERT_FALSE(ids.empty());
  EXPECT_NE(ids.front(), 1);
  EXPECT_EQ(ids.back(), 2);
  ASSERT_TRUE(tok.pad_token());
  EXPECT_EQ(tok.pad_token()->id, 2);
}

TEST_F(SentencePiece, TokenizerJsonWinsWhenBothExist) {
  write_file(dir_.path() / "tokenizer.json", tokenizer_doc(bpe_json({"a", "b"}, {})));
  EXPECT_NE(tokenizer::load(dir_.path()).describe().find("tokenizer.json"), std::string::npos);
}

TEST(SentencePieceFile, RefusesACorruptModel) {
  temp_dir dir;
  write_file(dir.path() / "tokenizer.model", "this is not a protobuf model");
  expect_error([&] { tokenizer::load(dir.path()); },
               {(dir.path() / "tokenizer.model").string(), "SentencePiece cannot load it"});
}

} // namespace
} // namespace rlforge::text::test
