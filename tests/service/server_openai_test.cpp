// The OpenAI-compatible endpoints over the recording test backend: /v1/models, whole answers of
// /v1/completions and /v1/chat/completions against the backend's samples, server-sent events
// that add up to the whole answer, a client that leaves mid-stream, and every bad input.
#include <httplib.h>

#include <atomic>
#include <thread>

#include "prompt/chat_prompt.hpp"
#include "tests/service/server_test_support.hpp"
#include "text/bpe_trainer.hpp"

namespace rlforge::service::test {
namespace {

/// ChatML after a plain-text start, so that the test backend's answers (copies of prompt[0] + j)
/// decode to visible text.
const char* chat_template =
    "{{- 'chat:' -}}{%- for message in messages -%}{{- '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>\\n' -}}{%- endfor -%}{%- if add_generation_prompt -%}{{- "
    "'<|im_start|>assistant\\n' -}}{%- endif -%}";

/// A server whose base model has a small trained tokenizer with a ChatML template.
class ServerOpenAI : public server_test {
protected:
  std::filesystem::path tokenizer_dir;

  ServerOpenAI() {
    tokenizer_dir = dir.path() / "tokenizer";
    text::bpe_trainer_options o;
    o.vocab_size = 300;
    o.chat_template = chat_template;
    text::write_tokenizer_files(
        tokenizer_dir,
        text::train_bpe("the cat sat on the mat. the dog sat on the log. hello world, hello "
                        "there. 0 1 2 3 4 5 6 7 8 9 abc abc abc",
                        o));
    backend.vocab = 300;
    opts.max_num_samples = 4;
    opts.stream_chunk_tokens = 3;
  }

  void start_with_tokenizer() {
    backend.set_tokenizer_id(tokenizer_dir.string());
    start();
  }

  prompt::chat_prompt chat() const { return prompt::chat_prompt::load(tokenizer_dir); }

  httplib::Client http(const std::string& key = test_key) const {
    httplib::Client c("127.0.0.1", server->port());
    c.set_read_timeout(20, 0);
    if (!key.empty())
      c.set_default_headers({{"Authorization", "Bearer " + key}});
    return c;
  }

  struct answer {
    int status = 0;
    json body;
  };
  answer post(const std::string& path, const std::string& body,
              const std::string& key = test_key) const {
    auto c = http(key);
    auto r = c.Post(path.c_str(), body, "application/json");
    if (!r)
      return {};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
  answer post(const std::string& path, const json& body) const { return post(path, body.dump()); }

  /// A refusal: the status, OpenAI's error body, its param and a message containing `words`.
  void expect_refused(const std::string& path, const std::string& body, int status,
                      const std::string& param, const std::string& words) const {
    auto a = post(path, body, test_key);
    EXPECT_EQ(a.status, status) << body << " -> " << a.body.dump();
    ASSERT_TRUE(a.body.is_object() && a.body.contains("error")) << a.body.dump();
    const auto& e = a.body.at("error");
    EXPECT_EQ(e.at("param").is_null() ? std::string() : e.at("param").get<std::string>(), param)
        << body;
    EXPECT_NE(e.at("message").get<std::string>().find(words), std::string::npos)
        << body << " -> " << e.at("message");
    EXPECT_TRUE(e.at("type").is_string());
  }

  /// The SSE frames of a streamed request, "[DONE]" included, as their data texts.
  std::vector<std::string> stream(const std::string& path, const json& body) const {
    auto c = http();
    std::string raw;
    httplib::Headers headers{{"Accept", "text/event-stream"}};
    auto r = c.Post(path.c_str(), headers, body.dump(), "application/json");
    EXPECT_TRUE(r);
    if (!r)
      return {};
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
    std::vector<std::string> frames;
    size_t at = 0;
    while (at < r->body.size()) {
      auto end = r->body.find("\n\n", at);
      if (end == std::string::npos)
        break;
      auto frame = r->body.substr(at, end - at);
      at = end + 2;
      if (frame.rfind("data: ", 0) == 0)
        frames.push_back(frame.substr(6));
    }
    EXPECT_EQ(at, r->body.size()) << "a frame does not end with a blank line";
    return frames;
  }
};

TEST_F(ServerOpenAI, ModelsListsTheBaseModelAndItsSamplerCheckpoints) {
  start_with_tokenizer();
  auto model = make_model();
  auto path = client->save_weights_for_sampler(model, 1, "s1");
  auto c = http();
  auto r = c.Get("/v1/models");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  auto j = json::parse(r->body);
  EXPECT_EQ(j.at("object"), "list");
  std::vector<std::string> ids;
  for (auto& m : j.at("data")) {
    EXPECT_EQ(m.at("object"), "model");
    ids.push_back(m.at("id"));
  }
  EXPECT_EQ(ids, (std::vector<std::string>{"test-base", path}));
  // Unauthenticated: OpenAI's error body.
  auto anonymous = http("");
  auto refused = anonymous.Get("/v1/models");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 401);
  EXPECT_EQ(json::parse(refused->body).at("error").at("type"), "authentication_error");
}

TEST_F(ServerOpenAI, ASamplerCheckpointPastItsTtlIsGone) {
  start_with_tokenizer();
  auto model = make_model();
  auto r = client->post("save_weights_for_sampler",
                        json{{"model_id", model}, {"seq_id", 1}, {"path", "brief"},
                             {"ttl_seconds", 1}}
                            .dump());
  const std::string path =
      json::parse(client->wait_future(tinker_client::request_id_of(r), false).body).at("path");
  json body{{"model", path}, {"prompt", {5, 6}}, {"max_tokens", 1}};
  auto a = post("/v1/completions", body);
  ASSERT_EQ(a.status, 200) << a.body.dump();
  std::this_thread::sleep_for(1100ms);
  a = post("/v1/completions", body);
  EXPECT_EQ(a.status, 404) << a.body.dump();
  EXPECT_EQ(a.body.at("error").at("param"), "model");
}

TEST_F(ServerOpenAI, CompletionsAnswerTheBackendsSamplesOfTheEncodedPrompt) {
  start_with_tokenizer();
  auto tok = chat().tokenizer();
  auto a = post("/v1/completions", json{{"model", "test-base"},
                                        {"prompt", "hello world"},
                                        {"max_tokens", 4},
                                        {"n", 2},
                                        {"seed", 3},
                                        {"logprobs", 0},
                                        {"return_tokens_as_token_ids", true}});
  ASSERT_EQ(a.status, 200) << a.body.dump();
  const auto ids = tok.encode("hello world", true);
  EXPECT_EQ(backend.prompts().back(), ids);
  EXPECT_EQ(a.body.at("object"), "text_completion");
  ASSERT_EQ(a.body.at("choices").size(), 2u);
  for (int64_t j = 0; j < 2; ++j) {
    const auto& c = a.body.at("choices")[static_cast<size_t>(j)];
    EXPECT_EQ(c.at("index"), j);
    // The test backend answers max_tokens copies of prompt[0] + j.
    const int64_t token = ids.at(0) + j;
    EXPECT_EQ(c.at("text"), tok.decode(std::vector<int64_t>(4, token), true));
    EXPECT_EQ(c.at("finish_reason"), "length");
    EXPECT_EQ(c.at("logprobs").at("tokens"),
              json(std::vector<std::string>(4, "token_id:" + std::to_string(token))));
    EXPECT_EQ(c.at("logprobs").at("token_logprobs"), json(std::vector<double>(4, -0.5)));
    EXPECT_TRUE(c.at("logprobs").at("top_logprobs").is_null());
  }
  EXPECT_EQ(a.body.at("usage").at("prompt_tokens"), ids.size());
  EXPECT_EQ(a.body.at("usage").at("completion_tokens"), 8);
  EXPECT_EQ(a.body.at("usage").at("total_tokens"), ids.size() + 8);
  // Token ids as the prompt: sampled as they are.
  a = post("/v1/completions", json{{"model", "test-base"}, {"prompt", {7, 8, 9}}, {"max_tokens", 2}});
  ASSERT_EQ(a.status, 200) << a.body.dump();
  EXPECT_EQ(backend.prompts().back(), (std::vector<int64_t>{7, 8, 9}));
  EXPECT_TRUE(a.body.at("choices")[0].at("logprobs").is_null());
}

TEST_F(ServerOpenAI, ChatRendersTheTemplateAndCutsTheAnswerAtAStopString) {
  start_with_tokenizer();
  auto c = chat();
  json messages = json::array({{{"role", "system"}, {"content", "be brief"}},
                               {{"role", "user"}, {"content", "hello there"}}});
  auto a = post("/v1/chat/completions",
                json{{"model", "test-base"}, {"messages", messages}, {"max_tokens", 5}});
  ASSERT_EQ(a.status, 200) << a.body.dump();
  const auto prompt = c.encode(nlohmann::ordered_json::parse(messages.dump()), true);
  EXPECT_EQ(backend.prompts().back(), prompt);
  EXPECT_EQ(a.body.at("object"), "chat.completion");
  const auto& choice = a.body.at("choices")[0];
  EXPECT_EQ(choice.at("message").at("role"), "assistant");
  const auto text = c.tokenizer().decode(std::vector<int64_t>(5, prompt.at(0)), true);
  EXPECT_EQ(choice.at("message").at("content"), text);
  // Text parts are joined; a stop string ends the content before it.
  json parts = json::array({{{"role", "user"},
                             {"content", json::array({{{"type", "text"}, {"text", "hello "}},
                                                      {{"type", "text"}, {"text", "there"}}})}}});
  ASSERT_GE(text.size(), 2u);
  const auto stop = text.substr(1, 1);
  a = post("/v1/chat/completions", json{{"model", "test-base"},
                                        {"messages", parts},
                                        {"max_tokens", 5},
                                        {"stop", stop}});
  ASSERT_EQ(a.status, 200) << a.body.dump();
  json joined = json::array({{{"role", "user"}, {"content", "hello there"}}});
  EXPECT_EQ(backend.prompts().back(), c.encode(nlohmann::ordered_json::parse(joined.dump()), true));
  EXPECT_EQ(a.body.at("choices")[0].at("message").at("content"), text.substr(0, text.find(stop)));
  EXPECT_EQ(a.body.at("choices")[0].at("finish_reason"), "stop");
}

TEST_F(ServerOpenAI, TopLogprobsComeFromScoringTheAnswer) {
  start_with_tokenizer();
  auto a = post("/v1/chat/completions",
                json{{"model", "test-base"},
                     {"messages", json::array({{{"role", "user"}, {"content", "abc"}}})},
                     {"max_tokens", 3},
                     {"logprobs", true},
                     {"top_logprobs", 2},
                     {"return_tokens_as_token_ids", true}});
  ASSERT_EQ(a.status, 200) << a.body.dump();
  auto prompts = backend.prompts();
  ASSERT_EQ(prompts.size(), 2u); // the sample, then its scoring
  const auto p = prompts[0].size();
  EXPECT_EQ(prompts[1].size(), p + 3);
  const auto& content = a.body.at("choices")[0].at("logprobs").at("content");
  ASSERT_EQ(content.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(content[i].at("logprob"), -0.5);
    // The test backend's top-k at position p + i: ids (p + i + j) % vocab, log-probs -j - 1.
    const auto& top = content[i].at("top_logprobs");
    ASSERT_EQ(top.size(), 2u);
    for (size_t j = 0; j < 2; ++j) {
      EXPECT_EQ(top[j].at("token"), "token_id:" + std::to_string((p + i + j) % 300));
      EXPECT_EQ(top[j].at("logprob"), -static_cast<double>(j) - 1);
    }
  }
}

TEST_F(ServerOpenAI, StreamedChunksAddUpToTheWholeAnswer) {
  start_with_tokenizer();
  json body{{"model", "test-base"},
            {"messages", json::array({{{"role", "user"}, {"content", "hello"}}})},
            {"max_tokens", 7},
            {"n", 2},
            {"seed", 1},
            {"logprobs", true}};
  auto whole = post("/v1/chat/completions", body);
  ASSERT_EQ(whole.status, 200) << whole.body.dump();
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto frames = stream("/v1/chat/completions", body);
  ASSERT_GE(frames.size(), 4u);
  EXPECT_EQ(frames.back(), "[DONE]");
  std::map<int64_t, std::string> content;
  std::map<int64_t, std::string> finish;
  std::map<int64_t, size_t> logprobs;
  std::map<int64_t, bool> role;
  json usage;
  std::string id;
  for (size_t f = 0; f + 1 < frames.size(); ++f) {
    auto j = json::parse(frames[f]);
    EXPECT_EQ(j.at("object"), "chat.completion.chunk");
    if (id.empty())
      id = j.at("id");
    EXPECT_EQ(j.at("id"), id) << "every chunk carries the answer's id";
    if (j.contains("usage")) {
      usage = j.at("usage");
      EXPECT_TRUE(j.at("choices").empty());
      continue;
    }
    for (auto& c : j.at("choices")) {
      auto i = c.at("index").get<int64_t>();
      const auto& d = c.at("delta");
      if (d.contains("role"))
        role[i] = true;
      if (d.contains("content"))
        content[i] += d.at("content").get<std::string>();
      if (!c.at("logprobs").is_null())
        logprobs[i] += c.at("logprobs").at("content").size();
      if (!c.at("finish_reason").is_null()) {
        EXPECT_EQ(finish.count(i), 0u) << "choice " << i << " finished twice";
        finish[i] = c.at("finish_reason");
      }
    }
  }
  for (int64_t i = 0; i < 2; ++i) {
    const auto& want = whole.body.at("choices")[static_cast<size_t>(i)];
    EXPECT_TRUE(role[i]);
    EXPECT_EQ(content[i], want.at("message").at("content")) << "choice " << i;
    EXPECT_EQ(finish[i], want.at("finish_reason"));
    EXPECT_EQ(logprobs[i], 7u);
  }
  EXPECT_EQ(usage, whole.body.at("usage"));
  // Chunks of at most 3 tokens: 7 tokens each take 3 calls (two samples per call).
  auto calls = backend.calls();
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "sample:base:2"), 1 + 3);
}

TEST_F(ServerOpenAI, AClientLeavingMidStreamStopsItsGeneration) {
  start_with_tokenizer();
  backend.set_sample_delay(20ms); // 60 chunks would take over a second
  json body{{"model", "test-base"},
            {"prompt", {5, 6}},
            {"max_tokens", 60},
            {"stream", true}};
  body["max_tokens"] = test_backend::context - 2;
  std::atomic<int> frames{0};
  {
    auto c = http();
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      frames += static_cast<int>(std::count(data, data + n, '\n')) / 2;
      return frames < 2; // leave after the second frame
    };
    httplib::Response res;
    httplib::Error error;
    c.send(req, res, error);
  }
  ASSERT_GE(frames.load(), 1);
  auto count = [&] {
    auto calls = backend.calls();
    return std::count(calls.begin(), calls.end(), "sample:base:1");
  };
  // Within a few chunks the generation stops: the calls stop growing, far below the 21 chunks
  // the whole answer takes.
  auto before = count();
  for (int i = 0; i < 100; ++i) {
    std::this_thread::sleep_for(50ms);
    auto now = count();
    if (now == before)
      break;
    before = now;
  }
  EXPECT_LE(before, 8) << "the stream went on generating for a client that left";
  EXPECT_EQ(before, count());
  // The server goes on serving.
  auto a = post("/v1/completions", json{{"model", "test-base"}, {"prompt", "abc"}, {"max_tokens", 1}});
  EXPECT_EQ(a.status, 200) << a.body.dump();
}

TEST_F(ServerOpenAI, BadRequestsAreRefusedNamingTheParameter) {
  start();
  // No tokenizer yet: the endpoints say so.
  expect_refused("/v1/completions", R"({"model":"test-base","prompt":"hi"})", 400, "",
                 "has no tokenizer");
  backend.set_tokenizer_id(tokenizer_dir.string());
  const std::string cc = "/v1/chat/completions";
  const std::string c = "/v1/completions";
  expect_refused(c, "not json", 400, "", "not valid JSON");
  expect_refused(c, R"([1,2])", 400, "", "must be a JSON object");
  expect_refused(c, R"({"prompt":"hi"})", 400, "model", "model is required");
  expect_refused(c, R"({"model":"nope","prompt":"hi"})", 404, "model", "not served here");
  expect_refused(c, R"({"model":"tinker://m/sampler_weights/x","prompt":"hi"})", 404, "model",
                 "no checkpoint");
  expect_refused(c, R"({"model":"test-base"})", 400, "prompt", "prompt is required");
  expect_refused(c, R"({"model":"test-base","prompt":""})", 400, "prompt", "empty");
  expect_refused(c, R"({"model":"test-base","prompt":["a","b"]})", 400, "prompt", "one prompt");
  expect_refused(c, R"({"model":"test-base","prompt":[1,"x"]})", 400, "prompt", "integers");
  expect_refused(c, R"({"model":"test-base","prompt":[1,999]})", 400, "prompt", "999");
  expect_refused(c, R"({"model":"test-base","prompt":"hi","n":5})", 400, "n", "limit of 4");
  expect_refused(c, R"({"model":"test-base","prompt":"hi","n":0})", 400, "n", ">= 1");
  expect_refused(c, R"({"model":"test-base","prompt":"hi","max_tokens":0})", 400, "max_tokens",
                 ">= 1");
  expect_refused(c, R"({"model":"test-base","prompt":"hi","max_tokens":500})", 400, "max_tokens",
                 "context of 64");
  expect_refused(c, R"({"model":"test-base","prompt":"hi","max_tokens":1.5})", 400, "max_tokens",
                 "integer");
  expect_refused(c, R"({"model":"test-base","prompt":"hi","temperature":3})", 400, "temperature",
                 "[0, 2]");
  expect_refused(c, R"({"model":"test-base","prompt":"hi","top_p":0})", 400, "top_p", "(0, 1]");
  expect_refused(c, R"({"model":"test-base","prompt":"hi","seed":-1})", 400, "seed", ">= 0");
  expect_refused(c, R"({"model":"test-base","prompt":"hi","stop":[""]})", 400, "stop", "empty");
  expect_refused(c, R"({"model":"test-base","prompt":"hi","stop":7})", 400, "stop", "string");
  expect_refused(c, R"({"model":"test-base","prompt":"hi","logprobs":21})", 400, "logprobs",
                 "0..20");
  expect_refused(c, R"({"model":"test-base","prompt":"hi","logprobs":2,"stream":true})", 400,
                 "logprobs", "not streamed");
  expect_refused(c, R"({"model":"test-base","prompt":"hi","echo":true})", 400, "echo",
                 "not supported");
  expect_refused(c, R"({"model":"test-base","prompt":"hi","presence_penalty":0.5})", 400,
                 "presence_penalty", "not supported");
  expect_refused(c, R"({"model":"test-base","prompt":"hi","frobnicate":1})", 400, "frobnicate",
                 "unknown parameter");
  expect_refused(c, R"({"model":"test-base","prompt":"hi","stream_options":{}})", 400,
                 "stream_options", "stream: true");
  expect_refused(cc, R"({"model":"test-base"})", 400, "messages", "required");
  expect_refused(cc, R"({"model":"test-base","messages":[]})", 400, "messages", "non-empty");
  expect_refused(cc, R"({"model":"test-base","messages":{"role":"user"}})", 400, "messages",
                 "non-empty list");
  expect_refused(cc, R"({"model":"test-base","messages":[{"content":"x"}]})", 400, "messages",
                 "string role");
  expect_refused(cc, R"({"model":"test-base","messages":[{"role":"wizard","content":"x"}]})", 400,
                 "messages", "role 'wizard'");
  expect_refused(cc, R"({"model":"test-base","messages":[{"role":"user"}]})", 400, "messages",
                 "needs content");
  expect_refused(cc, R"({"model":"test-base","messages":[{"role":"user","content":{"a":1}}]})",
                 400, "messages", "string or a list of text parts");
  expect_refused(cc,
                 R"({"model":"test-base","messages":[{"role":"user","content":[{"type":"image_url"}]}]})",
                 400, "messages", "only text parts");
  expect_refused(cc,
                 R"({"model":"test-base","messages":[{"role":"user","content":"x","tool_calls":[]}]})",
                 400, "messages", "tool_calls");
  expect_refused(cc, R"({"model":"test-base","messages":[{"role":"user","content":"x"}],"top_logprobs":2})",
                 400, "top_logprobs", "logprobs: true");
  expect_refused(cc, R"({"model":"test-base","messages":[{"role":"user","content":"x"}],"tools":[{}]})",
                 400, "tools", "not supported");
  expect_refused(cc, R"({"model":"test-base","messages":[{"role":"user","content":"x"}],"logprobs":1})",
                 400, "logprobs", "true or false");
  // A wrong key, the OpenAI way.
  auto wrong = post(c, std::string(R"({"model":"test-base","prompt":"hi"})"), "wrong-key");
  EXPECT_EQ(wrong.status, 401);
  EXPECT_EQ(wrong.body.at("error").at("type"), "authentication_error");
  // Nothing reached the backend, and the server goes on serving.
  EXPECT_TRUE(backend.prompts().empty());
  auto ok = post(cc, std::string(R"({"model":"test-base","messages":[{"role":"user","content":"x"}],"max_tokens":2})"));
  EXPECT_EQ(ok.status, 200) << ok.body.dump();
}

TEST_F(ServerOpenAI, AFullSampleQueueAnswers429) {
  opts.scheduler.max_pending_samples = 1;
  start_with_tokenizer();
  backend.hold();
  std::thread first([&] {
    auto a = post("/v1/completions", json{{"model", "test-base"}, {"prompt", "abc"}, {"max_tokens", 1}});
    EXPECT_EQ(a.status, 200) << a.body.dump();
  });
  ASSERT_TRUE(backend.wait_entered(1));
  auto refused = post("/v1/completions", json{{"model", "test-base"}, {"prompt", "abc"}, {"max_tokens", 1}});
  EXPECT_EQ(refused.status, 429);
  EXPECT_EQ(refused.body.at("error").at("type"), "rate_limit_error");
  backend.release();
  first.join();
}

} // namespace
} // namespace rlforge::service::test
