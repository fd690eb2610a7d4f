// text/stream_decoder.hpp: text released as ids arrive, never inside a character, adding up to
// what decode gives for all ids.
#include "tests/text/test_support.hpp"
#include "text/stream_decoder.hpp"

namespace rlforge::text::test {
namespace {

const std::string fffd = "\xEF\xBF\xBD";

std::vector<std::string> pushes(stream_decoder& s, const std::vector<int64_t>& ids) {
  std::vector<std::string> out;
  for (int64_t id : ids)
    out.push_back(s.push(id));
  return out;
}

std::string joined(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& p : parts)
    out += p;
  return out;
}

TEST(StreamDecoder, HoldsBackPartialCharacters) {
  auto tok = tokenizer::from_json(gpt2_like());
  auto ids = tok.encode("a😀b", false); // the emoji is four byte tokens
  ASSERT_EQ(ids.size(), 6u);
  stream_decoder s(tok, false);
  EXPECT_EQ(pushes(s, ids), (std::vector<std::string>{"a", "", "", "", "😀", "b"}));
  EXPECT_EQ(s.finish(), "");
}

TEST(StreamDecoder, AddsUpToTheFullDecode) {
  for (const std::string& doc : {gpt2_like(), llama2_like()}) {
    auto tok = tokenizer::from_json(doc);
    for (const std::string text : {"Hi there world", " the world 中文 👨‍👩‍👧 done",
                                   "Hi 中 there\nworld  ", "<s>Hi</s>"}) {
      auto ids = tok.encode(text, true);
      for (bool skip : {false, true}) {
        stream_decoder s(tok, skip);
        auto parts = pushes(s, ids);
        std::string tail = s.finish();
        EXPECT_EQ(joined(parts) + tail, tok.decode(ids, skip)) << text;
        for (const auto& p : parts)
          EXPECT_EQ(p.find(fffd), std::string::npos) << text;
      }
    }
  }
}

TEST(StreamDecoder, KeepsSpacesThatDependOnTheStartOfText) {
  // The Llama 2 decoder strips one leading space of the whole text, not of every piece.
  auto tok = tokenizer::from_json(llama2_like());
  stream_decoder s(tok, true);
  auto parts = pushes(s, tok.encode("Hi there world", true));
  EXPECT_EQ(parts, (std::vector<std::string>{"", "Hi", " there", " world"}));
}

TEST(StreamDecoder, FinishReleasesWhatIsHeldAndStartsOver) {
  auto tok = tokenizer::from_json(gpt2_like());
  auto ids = tok.encode("ok😀", false);
  stream_decoder s(tok, false);
  std::string out;
  for (size_t i = 0; i + 1 < ids.size(); ++i) // stop before the emoji's last byte
    out += s.push(ids[i]);
  EXPECT_EQ(out, "ok");
  EXPECT_EQ(s.finish(), fffd);
  // A new stream after finish.
  EXPECT_EQ(s.push(ids[0]), tok.decode({ids[0]}));
}

TEST(StreamDecoder, RefusedIdLeavesTheStreamAsItWas) {
  auto tok = tokenizer::from_json(gpt2_like());
  auto ids = tok.encode("the world", false);
  stream_decoder s(tok, false);
  std::string out = s.push(ids[0]);
  expect_error([&] { s.push(100000); }, {"token id 100000"});
  for (size_t i = 1; i < ids.size(); ++i)
    out += s.push(ids[i]);
  EXPECT_EQ(out + s.finish(), "the world");
}

TEST(StreamDecoder, LongStreamsStayCorrect) {
  auto tok = tokenizer::from_json(gpt2_like());
  std::string text;
  for (int i = 0; i < 3000; ++i)
    text += "the world é中 " + std::to_string(i) + "\n";
  auto ids = tok.encode(text, false);
  stream_decoder s(tok, false);
  std::string out;
  for (int64_t id : ids)
    out += s.push(id);
  EXPECT_EQ(out + s.finish(), text);
}

} // namespace
} // namespace rlforge::text::test
