// prompt/chat_prompt.hpp: loading a model directory's tokenizer and template, rendering and
// encoding messages, the end-of-turn token, and the continuation of multi-turn rollouts.
#include "prompt/chat_prompt.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "text/bpe_trainer.hpp"
#include "text/error.hpp"
#include "text/model_tokenizer.hpp"
#include "tests/support/temp_dir.hpp"

namespace rlforge::prompt {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

using rlforge::test_support::temp_dir;

/// The directory of a model with init-model's tokenizer for `vocab` ids.
struct model_dir : temp_dir {
  explicit model_dir(size_t vocab = 512) {
    text::write_tokenizer_files(path(), text::train_model_tokenizer(vocab));
  }
};

json message(const std::string& role, const std::string& content) {
  return json{{"role", role}, {"content", content}};
}

template <class E> void expect_throws(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no error (expected one mentioning " << part << ")";
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(ChatPrompt, RendersAndEncodesMessagesWithTheModelsTemplate) {
  model_dir dir;
  auto chat = chat_prompt::load(dir.path());
  ASSERT_TRUE(chat.has_template());
  const json messages = json::array({message("system", "Be brief."), message("user", "Hi!")});
  const std::string want = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!"
                           "<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(chat.render(messages, true), want);
  EXPECT_EQ(chat.render(messages, false), want.substr(0, want.size() - 22));
  const auto ids = chat.encode(messages, true);
  EXPECT_EQ(ids, chat.tokenizer().encode(want, false));
  EXPECT_EQ(ids.front(), *chat.tokenizer().token_to_id("<|im_start|>"));
  EXPECT_EQ(chat.tokenizer().decode(ids), want);
}

TEST(ChatPrompt, FindsTheEndOfTurnTokenTheTemplateWrites) {
  model_dir dir;
  auto chat = chat_prompt::load(dir.path());
  EXPECT_EQ(chat.end_of_turn_id(), chat.tokenizer().token_to_id("<|im_end|>"));

  // A Llama-3-style layout (written for this test) ends turns with another token.
  text::bpe_trainer_options o;
  o.vocab_size = 300;
  o.special_tokens = {"<|begin|>", "<|header|>", "<|end_header|>", "<|turn_end|>"};
  o.bos_token = "<|begin|>";
  o.eos_token.reset(); // so that the token found cannot be the eos fallback
  o.pad_token.reset();
  o.chat_template = "{{ bos_token }}{% for m in messages %}<|header|>{{ m.role }}<|end_header|>"
                    "{{ m.content }}<|turn_end|>{% endfor %}"
                    "{% if add_generation_prompt %}<|header|>assistant<|end_header|>{% endif %}";
  temp_dir other;
  text::write_tokenizer_files(other.path(), text::train_bpe(text::builtin_corpus(), o));
  auto llama_like = chat_prompt::load(other.path());
  EXPECT_EQ(llama_like.end_of_turn_id(), llama_like.tokenizer().token_to_id("<|turn_end|>"));
}

TEST(ChatPrompt, WithoutATemplateEncodesNoMessagesAndStopsOnEos) {
  temp_dir dir;
  text::bpe_trainer_options o;
  o.vocab_size = 300;
  text::write_tokenizer_files(dir.path(), text::train_bpe(text::builtin_corpus(), o));
  auto chat = chat_prompt::load(dir.path());
  EXPECT_FALSE(chat.has_template());
  EXPECT_EQ(chat.end_of_turn_id(), chat.tokenizer().token_to_id("<|endoftext|>"));
  expect_throws<prompt_error>([&] { chat.render(json::array({message("user", "x")}), true); },
                              "no chat template");
}

TEST(ChatPrompt, RefusesAMissingTokenizerAndABrokenTemplate) {
  temp_dir empty;
  expect_throws<text::tokenizer_error>([&] { chat_prompt::load(empty.path()); },
                                       "neither tokenizer.json nor tokenizer.model");
  model_dir dir;
  std::ofstream(dir.path() / "chat_template.jinja") << "{% for m in messages %}{{ m.content }";
  expect_throws<chat::template_error>([&] { chat_prompt::load(dir.path()); }, "syntax");
}

TEST(ChatPrompt, TheTemplateRefusesMessagesWithoutStringContent) {
  model_dir dir;
  auto chat = chat_prompt::load(dir.path());
  const json bad = json::array({json{{"role", "user"}, {"content", 7}}});
  expect_throws<chat::template_error>([&] { chat.render(bad, true); },
                                      "message 1 needs a string role and a string content");
}

TEST(ChatPrompt, DecodesGeneratedIdsLeavingOutIdsWithoutAToken) {
  model_dir dir(4096);
  auto chat = chat_prompt::load(dir.path());
  const auto vocab = chat.tokenizer().vocab_size();
  ASSERT_LT(vocab, 4096);
  auto ids = chat.tokenizer().encode("I guess 42.", false);
  auto with_unknown = ids;
  with_unknown.insert(with_unknown.begin() + 1, vocab + 7);
  with_unknown.push_back(4095);
  with_unknown.push_back(*chat.end_of_turn_id());
  EXPECT_EQ(chat.decode_generated(with_unknown, true), "I guess 42.");
  EXPECT_EQ(chat.decode_generated(with_unknown, false), "I guess 42.<|im_end|>");
}

TEST(ChatPrompt, ContinuationKeepsTheSampledTokensAndAppendsTheNextTurn) {
  model_dir dir;
  auto chat = chat_prompt::load(dir.path());
  json history = json::array({message("user", "Guess my number.")});
  auto ids = chat.encode(history, true);
  const auto eot = *chat.end_of_turn_id();

  // A turn that ended with the end-of-turn token.
  auto sampled = chat.tokenizer().encode("I guess 50", false);
  sampled.push_back(eot);
  ids.insert(ids.end(), sampled.begin(), sampled.end());
  history.push_back(message("assistant", "I guess 50"));
  auto next = chat.continuation(history, true, message("user", "Higher than 50."));
  EXPECT_EQ(chat.tokenizer().decode(next), "\n<|im_start|>user\nHigher than 50.<|im_end|>\n"
                                           "<|im_start|>assistant\n");
  ids.insert(ids.end(), next.begin(), next.end());
  history.push_back(message("user", "Higher than 50."));
  EXPECT_EQ(chat.tokenizer().decode(ids), chat.render(history, true));

  // A turn cut off before its end-of-turn token: the template's end of the turn is added.
  sampled = chat.tokenizer().encode("75", false);
  ids.insert(ids.end(), sampled.begin(), sampled.end());
  history.push_back(message("assistant", "75"));
  next = chat.continuation(history, false, message("user", "Lower than 75."));
  EXPECT_EQ(next.front(), eot);
  ids.insert(ids.end(), next.begin(), next.end());
  history.push_back(message("user", "Lower than 75."));
  EXPECT_EQ(chat.tokenizer().decode(ids), chat.render(history, true));
}

TEST(ChatPrompt, ContinuationRefusesTemplatesThatDoNotOnlyAppend) {
  model_dir dir;
  const auto tok = text::tokenizer::load(dir.path());
  const json history = json::array({message("user", "Hi"), message("assistant", "Hello")});
  const json next = message("user", "Again");
  // Only the last message: earlier turns disappear.
  chat_prompt last_only(tok, chat::template_renderer("{{ messages[-1].content }}", json::object()));
  expect_throws<prompt_error>([&] { last_only.continuation(history, false, next); },
                              "only appends");
  // The assistant's text is rewritten.
  chat_prompt upper(tok, chat::template_renderer(
                             "{% for m in messages %}{{ m.content|upper }}<|im_end|>{% endfor %}",
                             json::object()));
  expect_throws<prompt_error>([&] { upper.continuation(history, false, next); }, "verbatim");
  // The history must end with the assistant's turn.
  auto chat = chat_prompt::load(dir.path());
  expect_throws<prompt_error>(
      [&] { chat.continuation(json::array({message("user", "Hi")}), false, next); },
      "must end with an assistant message");
}

} // namespace
} // namespace rlforge::prompt
