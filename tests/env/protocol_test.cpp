// env/protocol.hpp: the codec of the JSON-lines protocol.
#include "env/protocol.hpp"

#include "tests/env/test_support.hpp"

namespace rlforge::env::test {
namespace {

using nlohmann::json;
namespace p = protocol;

TEST(EnvProtocol, EncodesRequests) {
  reset_request r;
  r.seed = 7;
  r.task = {{"secret", 3}};
  EXPECT_EQ(
      json::parse(p::encode_reset(1, r)),
      json::parse(R"({"id": 1, "method": "reset", "params": {"seed": 7, "task": {"secret": 3}}})"));
  EXPECT_EQ(json::parse(p::encode_reset(2, reset_request{}))["params"]["seed"], nullptr);
  EXPECT_EQ(json::parse(p::encode_step(3, "héllo\n\"x\"")),
            json::parse(R"({"id": 3, "method": "step", "params": {"action": "héllo\n\"x\""}})"));
  EXPECT_EQ(p::encode_step(3, "a\nb").find('\n'), std::string::npos); // one line
  EXPECT_EQ(json::parse(p::encode_close(4)),
            json::parse(R"({"id": 4, "method": "close", "params": {}})"));
  expect_env_error([] { p::encode_step(1, "\xff"); }, failure::usage, {"not valid UTF-8"});
}

TEST(EnvProtocol, ChecksTheHandshake) {
  p::check_handshake(R"({"protocol": "rlforge.env", "version": 1, "name": "x"})");
  expect_env_error([] { p::check_handshake("hello"); }, failure::handshake,
                   {"not a JSON object", "'hello'"});
  expect_env_error([] { p::check_handshake(R"({"protocol": "other", "version": 1})"); },
                   failure::handshake, {"does not name protocol"});
  expect_env_error([] { p::check_handshake(R"({"protocol": "rlforge.env", "version": 2})"); },
                   failure::handshake, {"version 2 is not supported"});
  expect_env_error([] { p::check_handshake(R"({"protocol": "rlforge.env"})"); }, failure::handshake,
                   {"no integer version"});
}

TEST(EnvProtocol, DecodesReplies) {
  const json r =
      p::decode_reply(R"({"id": 5, "result": {"observation": "o", "extra": 1}})", 5, "reset");
  const auto reset = p::decode_reset_result(r);
  EXPECT_EQ(reset.observation, "o");
  EXPECT_TRUE(reset.info.is_object());
  const auto step = p::decode_step_result(
      json::parse(R"({"observation": "x", "reward": 1, "done": true, "info": {"k": [1]}})"));
  EXPECT_EQ(step.observation, "x");
  EXPECT_EQ(step.reward, 1.0);
  EXPECT_TRUE(step.done);
  EXPECT_EQ(step.info["k"][0], 1);
}

TEST(EnvProtocol, RefusesMalformedRepliesSayingWhatIsWrong) {
  const struct {
    const char* line;
    const char* part;
  } cases[] = {
      {"not json", "is not JSON"},
      {"[1]", "not an object"},
      {R"({"result": {}})", "has no \"id\""},
      {R"({"id": "1", "result": {}})", "not an integer"},
      {R"({"id": 2, "result": {}})", "carries id 2 (wrong id)"},
      {R"({"id": 1})", "neither \"result\" nor \"error\""},
      {R"({"id": 1, "result": {}, "error": {}})", "both"},
      {R"({"id": 1, "result": 5})", "not an object"},
      {R"({"id": 1, "error": "bad"})", "without a string \"message\""},
      {"{\"id\": 1, \"result\": {\"observation\": \"\xc3\x28\"}}", "not valid UTF-8"},
  };
  for (const auto& c : cases)
    expect_env_error([&] { p::decode_reply(c.line, 1, "step"); }, failure::protocol,
                     {c.part, "'step' (id 1)"});
  expect_env_error(
      [] {
        p::decode_reply(R"({"id": 1, "error": {"message": "no", "type": "KeyError"}})", 1, "step");
      },
      failure::environment, {"refused 'step': KeyError: no"});
}

TEST(EnvProtocol, RefusesMissingOrMistypedResultFields) {
  const struct {
    const char* result;
    const char* part;
  } steps[] = {
      {R"({"reward": 0, "done": false})", "lacks \"observation\""},
      {R"({"observation": 1, "reward": 0, "done": false})", "\"observation\" is a number"},
      {R"({"observation": "", "done": false})", "lacks \"reward\""},
      {R"({"observation": "", "reward": "1", "done": false})", "\"reward\" is a string"},
      {R"({"observation": "", "reward": 0})", "lacks \"done\""},
      {R"({"observation": "", "reward": 0, "done": 1})", "\"done\" is a number"},
      {R"({"observation": "", "reward": 0, "done": true, "info": []})", "\"info\" is an array"},
  };
  for (const auto& c : steps)
    expect_env_error([&] { p::decode_step_result(json::parse(c.result)); }, failure::protocol,
                     {c.part});
  expect_env_error([] { p::decode_reset_result(json::parse(R"({"info": {}})")); },
                   failure::protocol, {"reset result lacks \"observation\""});
}

TEST(EnvProtocol, ExcerptsAreShortAndPrintable) {
  EXPECT_EQ(p::excerpt("a\x01"
                       "b"),
            "'a\\x01b'");
  EXPECT_EQ(p::excerpt(std::string(500, 'x'), 10), "'xxxxxxxxxx...'");
}

TEST(EnvProtocol, ValidatesUtf8) {
  EXPECT_TRUE(p::valid_utf8(""));
  EXPECT_TRUE(p::valid_utf8("plain ascii"));
  EXPECT_TRUE(p::valid_utf8("Gr\xc3\xbc\xc3\x9f \xe2\x82\xac \xf0\x9f\x98\x80")); // ü ß € 😀
  EXPECT_FALSE(p::valid_utf8("\xc3"));                 // truncated
  EXPECT_FALSE(p::valid_utf8("\xc0\xaf"));             // overlong '/'
  EXPECT_FALSE(p::valid_utf8("\xed\xa0\x80"));         // a surrogate
  EXPECT_FALSE(p::valid_utf8("\xf4\x90\x80\x80"));     // past U+10FFFF
  EXPECT_FALSE(p::valid_utf8("\x80 lone continuation"));
}

} // namespace
} // namespace rlforge::env::test
