// openai::choice_text: the text of a choice released as its tokens arrive, one token at a time,
// equals the text of the whole answer; nothing released is a partial character or the start of a
// stop string that later tokens complete; a stop string ends the text before it.
#include "service/openai/response.hpp"

#include <gtest/gtest.h>

#include "tests/support/temp_dir.hpp"
#include "text/bpe_trainer.hpp"

namespace rlforge::service::openai {
namespace {

class ChoiceText : public ::testing::Test {
protected:
  ChoiceText() : dir_("openai_text") {
    text::bpe_trainer_options o;
    o.vocab_size = 300;
    text::write_tokenizer_files(dir_.path(),
                                text::train_bpe("hello world, hello there. caf\xC3\xA9 au lait", o));
    chat_.emplace(prompt::chat_prompt::load(dir_.path()));
  }

  std::vector<int64_t> ids(const std::string& s) const {
    return chat_->tokenizer().encode(s, false);
  }

  /// Pushes `s`'s ids one at a time; returns each piece released.
  std::vector<std::string> pieces(const std::string& s, const std::vector<std::string>& stop,
                                  bool* stopped = nullptr) const {
    choice_text t(*chat_, stop);
    std::vector<std::string> out;
    auto all = ids(s);
    for (size_t i = 0; i < all.size(); ++i)
      out.push_back(t.push({all[i]}, i + 1 == all.size()));
    if (stopped)
      *stopped = t.stopped_by_string();
    return out;
  }

  static std::string joined(const std::vector<std::string>& xs) {
    std::string s;
    for (const auto& x : xs)
      s += x;
    return s;
  }

  rlforge::test_support::temp_dir dir_;
  std::optional<prompt::chat_prompt> chat_;
};

TEST_F(ChoiceText, PiecesAddUpToTheWholeText) {
  const std::string s = "hello world, hello there. caf\xC3\xA9 au lait";
  bool stopped = true;
  EXPECT_EQ(joined(pieces(s, {}, &stopped)), s);
  EXPECT_FALSE(stopped);
}

TEST_F(ChoiceText, AStopStringEndsTheTextBeforeIt) {
  const std::string s = "hello world, hello there";
  bool stopped = false;
  EXPECT_EQ(joined(pieces(s, {"o w", "there"}, &stopped)), "hell");
  EXPECT_TRUE(stopped);
  // The earliest of several.
  EXPECT_EQ(joined(pieces(s, {"there", ", h"}, &stopped)), "hello world");
  // Pushed whole, the same.
  choice_text whole(*chat_, {"o w"});
  EXPECT_EQ(whole.push(ids(s), true), "hell");
  EXPECT_EQ(whole.push(ids("more"), true), "") << "nothing after a stop string";
}

TEST_F(ChoiceText, NothingReleasedIsTheStartOfAStopString) {
  // "hello" ends in "o", which may begin "o w": it is held back until the next token says no.
  choice_text t(*chat_, {"o w"});
  std::string released;
  for (auto id : ids("hello"))
    released += t.push({id}, false);
  EXPECT_EQ(released, "hell");
  released += t.push(ids("!"), false);
  EXPECT_EQ(released, "hello!");
  // A stop string that never completes is released at the end.
  choice_text u(*chat_, {"lait!"});
  EXPECT_EQ(joined({u.push(ids("au lai"), false), u.push(ids("t"), true)}), "au lait");
}

TEST_F(ChoiceText, AnIncompleteCharacterIsHeldBack) {
  // "é" is two bytes; with a byte-level vocabulary the first byte alone decodes to U+FFFD.
  auto e = ids("\xC3\xA9");
  choice_text t(*chat_, {});
  std::string released = t.push(ids("caf"), false);
  for (size_t i = 0; i + 1 < e.size(); ++i)
    EXPECT_EQ(t.push({e[i]}, false), "") << "a partial character was released";
  released += t.push({e.back()}, false);
  EXPECT_EQ(released, "caf\xC3\xA9");
}

TEST_F(ChoiceText, FinishReasonsAreOpenAIs) {
  EXPECT_EQ(finish_reason("stop", false), "stop");
  EXPECT_EQ(finish_reason("length", true), "stop");
  EXPECT_EQ(finish_reason("length", false), "length");
}

} // namespace
} // namespace rlforge::service::openai
