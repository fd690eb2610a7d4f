// text/model_tokenizer.hpp: the tokenizer init-model writes, for small and large model
// vocabularies.
#include "tests/text/test_support.hpp"
#include "text/model_tokenizer.hpp"
#include "text/tokenizer.hpp"

namespace rlforge::text::test {
namespace {

using nlohmann::json;

tokenizer load(const tokenizer_files& f) {
  return tokenizer::from_json(f.tokenizer_json, f.tokenizer_config_json);
}

TEST(ModelTokenizer, FillsASmallVocabularyWithTheSpecialTokensLast) {
  auto tok = load(train_model_tokenizer(512));
  EXPECT_EQ(tok.vocab_size(), 512);
  EXPECT_EQ(tok.token_to_id("<|endoftext|>"), 509);
  EXPECT_EQ(tok.token_to_id("<|im_start|>"), 510);
  EXPECT_EQ(tok.token_to_id("<|im_end|>"), 511);
  for (int64_t id : {509, 510, 511})
    EXPECT_TRUE(tok.is_special(id)) << id;
  ASSERT_TRUE(tok.eos_token());
  EXPECT_EQ(tok.eos_token()->content, "<|endoftext|>");
  ASSERT_TRUE(tok.pad_token());
  EXPECT_EQ(tok.pad_token()->id, 509);
  EXPECT_FALSE(tok.bos_token());
  // Words of the corpus became single tokens; digits stay single.
  EXPECT_EQ(tok.encode(" number", false).size(), 1u);
  EXPECT_EQ(tok.encode("100", false).size(), 3u);
  // Every id names a token, so anything a 512-id model samples decodes.
  for (int64_t id = 0; id < 512; ++id)
    EXPECT_TRUE(tok.id_to_token(id)) << id;
  const std::string text = "<|im_start|>user\nI guess 50. Ωμέγα 😀<|im_end|>\n";
  EXPECT_EQ(tok.decode(tok.encode(text, true)), text);
}

TEST(ModelTokenizer, CarriesTheChatTemplateInItsConfig) {
  auto files = train_model_tokenizer(512);
  auto config = json::parse(files.tokenizer_config_json);
  ASSERT_TRUE(config.contains("chat_template"));
  EXPECT_EQ(config["chat_template"].get<std::string>(), std::string(chatml_template()));
  EXPECT_EQ(config["eos_token"], "<|endoftext|>");
}

TEST(ModelTokenizer, NeverExceedsALargeModelVocabulary) {
  for (size_t vocab : {size_t{259}, size_t{300}, size_t{4096}, size_t{151936}}) {
    auto tok = load(train_model_tokenizer(vocab));
    EXPECT_LE(tok.vocab_size(), static_cast<int64_t>(vocab)) << vocab;
    EXPECT_EQ(tok.token_to_id("<|im_end|>"), tok.vocab_size() - 1) << vocab;
  }
  // The corpus bounds the merges: a huge vocabulary gets the same tokenizer as a size past it.
  auto big = load(train_model_tokenizer(151936));
  EXPECT_LT(big.vocab_size(), 4096);
  EXPECT_GT(big.vocab_size(), 512);
}

TEST(ModelTokenizer, IsDeterministic) {
  auto a = train_model_tokenizer(512);
  auto b = train_model_tokenizer(512);
  EXPECT_EQ(a.tokenizer_json, b.tokenizer_json);
  EXPECT_EQ(a.tokenizer_config_json, b.tokenizer_config_json);
}

TEST(ModelTokenizer, RefusesAVocabularyTooSmallForBytesAndSpecialTokens) {
  expect_error([] { train_model_tokenizer(258); }, {"at least 259", "has 258"});
}

} // namespace
} // namespace rlforge::text::test
