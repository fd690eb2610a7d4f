#include "tests/service/wire_test_support.hpp"

#include "service/wire/sample_codec.hpp"

namespace rlforge::service::test {
namespace {

// -- sampling -----------------------------------------------------------------------------------

const char* sample_json = R"({"num_samples":4,
  "prompt":{"chunks":[{"tokens":[1,2,3],"type":"encoded_text"}]},
  "sampling_params":{"max_tokens":16,"seed":7,"stop":[5,6],"temperature":0.7,"top_k":-1,
                     "top_p":0.9},
  "sampling_session_id":"sess-1:sample:0","seq_id":2,"prompt_logprobs":true,
  "topk_prompt_logprobs":0,"type":"sample"})";

std::string edit_sample(const std::function<void(json&)>& edit) {
  auto j = json::parse(sample_json);
  edit(j);
  return j.dump();
}

TEST(TinkerWireSample, DecodesTheSdkBody) {
  const auto b = decode_sample(sample_json);
  const auto& r = b.request;
  EXPECT_EQ(r.sampling_session_id, "sess-1:sample:0");
  EXPECT_EQ(r.seq_id, 2);
  EXPECT_EQ(r.num_samples, 4);
  EXPECT_EQ(r.prompt, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_TRUE(r.prompt_logprobs);
  EXPECT_EQ(r.topk_prompt_logprobs, 0);
  EXPECT_EQ(r.params.max_tokens, 16);
  EXPECT_TRUE(r.params.has_seed);
  EXPECT_EQ(r.params.seed, 7);
  EXPECT_EQ(r.params.stop_tokens, (std::vector<int64_t>{5, 6}));
  EXPECT_TRUE(r.params.stop_strings.empty());
  EXPECT_DOUBLE_EQ(r.params.temperature, 0.7);
  EXPECT_EQ(r.params.top_k, -1);
  EXPECT_DOUBLE_EQ(r.params.top_p, 0.9);
  EXPECT_TRUE(b.model_path.empty());
}

TEST(TinkerWireSample, DefaultsStopStringsAndOlderAddressing) {
  const auto b = decode_sample(R"({"prompt":{"chunks":[{"tokens":[4],"type":"encoded_text"}]},
    "sampling_params":{"max_tokens":1,"stop":"\n\n","top_k":0},
    "model_path":"tinker://run/sampler_weights/1"})");
  EXPECT_EQ(b.model_path, "tinker://run/sampler_weights/1");
  EXPECT_EQ(b.request.num_samples, 1);
  EXPECT_FALSE(b.request.params.has_seed);
  EXPECT_EQ(b.request.params.stop_strings, (std::vector<std::string>{"\n\n"}));
  EXPECT_EQ(b.request.params.top_k, -1); // 0 means off
  EXPECT_DOUBLE_EQ(b.request.params.temperature, 1.0);
  EXPECT_FALSE(b.request.prompt_logprobs);
  const auto s = decode_sample(edit_sample([](json& j) {
    j["sampling_params"]["stop"] = {"a", "b"};
  }));
  EXPECT_EQ(s.request.params.stop_strings, (std::vector<std::string>{"a", "b"}));
}

TEST(TinkerWireSample, RefusesBadBodies) {
  struct bad_case {
    std::function<void(json&)> edit;
    std::vector<std::string> parts;
  };
  const std::vector<bad_case> cases = {
      {[](json& j) { j.erase("sampling_session_id"); },
       {"one of 'sampling_session_id', 'model_path' or 'base_model' is required"}},
      {[](json& j) { j.erase("seq_id"); }, {"'seq_id' is required with a sampling_session_id"}},
      {[](json& j) { j["model_path"] = "/tmp/x"; }, {"'model_path' must start with tinker://"}},
      {[](json& j) { j["prompt"]["chunks"][0]["type"] = "image_asset_pointer"; },
       {"only encoded_text"}},
      {[](json& j) { j.erase("sampling_params"); }, {"'sampling_params' is required"}},
      {[](json& j) { j["sampling_params"].erase("max_tokens"); },
       {"'sampling_params.max_tokens' is required"}},
      {[](json& j) {
         j["sampling_params"]["stop"] = {1, "x"};
       },
       {"'sampling_params.stop' mixes"}},
      {[](json& j) { j["sampling_params"]["stop"] = 3; }, {"stop' must be a string or an array"}},
      {[](json& j) { j["sampling_params"]["stop"] = {true}; },
       {"stop' entry 0 must be a string or an integer"}},
      {[](json& j) { j["prompt_logprobs"] = 1; }, {"'prompt_logprobs' must be a boolean"}},
      {[](json& j) { j["type"] = "asample"; }, {"'type' is \"asample\", expected \"sample\""}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    const auto body = edit_sample(cases[i].edit);
    try {
      decode_sample(body);
      ADD_FAILURE() << "accepted " << body;
    } catch (const request_error& e) {
      EXPECT_EQ(e.category(), tinker::error_category::user);
      EXPECT_EQ(std::string(e.what()).rfind("asample: ", 0), 0u) << e.what();
      for (const auto& p : cases[i].parts)
        EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
            << "message \"" << e.what() << "\" lacks \"" << p << "\"";
    }
  }
}

// The values of a sample request are the backend's to check, against the model
// (tinker::check_sample, tests/tinker): the decoder keeps them as sent.
TEST(TinkerWireSample, DecodesWhatOnlyTheModelCanRefuse) {
  const auto body = edit_sample([](json& j) {
    j["num_samples"] = 0;
    j["prompt"]["chunks"][0]["tokens"] = {-2, 100000};
    j["sampling_params"]["max_tokens"] = 0;
    j["sampling_params"]["temperature"] = -0.1;
    j["sampling_params"]["top_p"] = 1.5;
    j["sampling_params"]["top_k"] = -2;
    j["sampling_params"]["stop"] = {-1};
    j["topk_prompt_logprobs"] = 5;
  });
  const auto r = decode_sample(body).request;
  EXPECT_EQ(r.num_samples, 0);
  EXPECT_EQ(r.prompt, (std::vector<int64_t>{-2, 100000}));
  EXPECT_EQ(r.params.max_tokens, 0);
  EXPECT_EQ(r.params.temperature, -0.1);
  EXPECT_EQ(r.params.top_p, 1.5);
  EXPECT_EQ(r.params.top_k, -2);
  EXPECT_EQ(r.params.stop_tokens, (std::vector<int64_t>{-1}));
  EXPECT_EQ(r.topk_prompt_logprobs, 5);
}

tinker::sample_response two_sequences() {
  tinker::sample_response r;
  r.sequences.push_back({"stop", {5, 6, 2}, {-0.5, -0.25, -1.0}});
  r.sequences.push_back({"length", {7}, {-2.0}});
  r.has_prompt_logprobs = true;
  r.prompt_logprobs = {0.0, -3.0, -4.5};
  return r;
}

TEST(TinkerWireSample, EncodesTheProtoResponse) {
  tinker_public::SampleResponse msg;
  ASSERT_TRUE(msg.ParseFromString(encode_sample_response_proto(two_sequences())));
  ASSERT_EQ(msg.sequences_size(), 2);
  EXPECT_EQ(msg.sequences(0).stop_reason(), tinker_public::STOP_REASON_STOP);
  EXPECT_EQ(msg.sequences(1).stop_reason(), tinker_public::STOP_REASON_LENGTH);
  EXPECT_EQ(from_raw<int32_t>(msg.sequences(0).tokens()), (std::vector<int32_t>{5, 6, 2}));
  ASSERT_TRUE(msg.sequences(0).has_logprobs());
  EXPECT_EQ(from_raw<float>(msg.sequences(0).logprobs()),
            (std::vector<float>{-0.5f, -0.25f, -1.0f}));
  ASSERT_TRUE(msg.has_prompt_logprobs());
  const auto plp = from_raw<float>(msg.prompt_logprobs());
  ASSERT_EQ(plp.size(), 3u);
  EXPECT_TRUE(std::isnan(plp[0])); // forced NaN: the SDK maps it to None
  EXPECT_EQ(plp[1], -3.0f);
  EXPECT_EQ(plp[2], -4.5f);
  EXPECT_FALSE(msg.has_topk_prompt_logprobs());

  auto plain = two_sequences();
  plain.has_prompt_logprobs = false;
  ASSERT_TRUE(msg.ParseFromString(encode_sample_response_proto(plain)));
  EXPECT_FALSE(msg.has_prompt_logprobs());
}

// topk_prompt_logprobs: a prompt_length x k matrix in the proto (row 0 the empty cells), rows of
// [id, log-prob] pairs in JSON (null for row 0), as the SDK reads them.
TEST(TinkerWireSample, EncodesAndDecodesTopkPromptLogprobs) {
  auto r = two_sequences();
  r.topk = 2;
  r.topk_prompt_ids = {0, 0, 9, 4, 3, 7};
  r.topk_prompt_logprobs = {tinker::topk_empty_logprob, tinker::topk_empty_logprob, -0.5, -1.5,
                            -0.25, -2.0};
  tinker_public::SampleResponse msg;
  ASSERT_TRUE(msg.ParseFromString(encode_sample_response_proto(r)));
  ASSERT_TRUE(msg.has_topk_prompt_logprobs());
  EXPECT_EQ(msg.topk_prompt_logprobs().k(), 2u);
  EXPECT_EQ(msg.topk_prompt_logprobs().prompt_length(), 3u);
  EXPECT_EQ(from_raw<int32_t>(msg.topk_prompt_logprobs().token_ids()),
            (std::vector<int32_t>{0, 0, 9, 4, 3, 7}));
  EXPECT_EQ(from_raw<float>(msg.topk_prompt_logprobs().logprobs()),
            (std::vector<float>{-99999.0f, -99999.0f, -0.5f, -1.5f, -0.25f, -2.0f}));
  auto back = decode_sample_response_proto(encode_sample_response_proto(r));
  EXPECT_EQ(back.topk, 2);
  EXPECT_EQ(back.topk_prompt_ids, r.topk_prompt_ids);
  EXPECT_EQ(back.topk_prompt_logprobs, r.topk_prompt_logprobs);
  auto j = json::parse(encode_sample_response_json(r));
  EXPECT_EQ(j.at("topk_prompt_logprobs"),
            json::parse("[null, [[9, -0.5], [4, -1.5]], [[3, -0.25], [7, -2.0]]]"));
  // A response whose matrix is not rows of k is the server's bug, refused by name.
  r.topk_prompt_ids.pop_back();
  EXPECT_THROW(encode_sample_response_proto(r), tinker::request_error);
  // A proto whose cells disagree with k x prompt_length is refused naming it.
  msg.mutable_topk_prompt_logprobs()->set_k(3);
  try {
    decode_sample_response_proto(msg.SerializeAsString());
    ADD_FAILURE() << "accepted";
  } catch (const tinker::request_error& e) {
    EXPECT_NE(std::string(e.what()).find("topk_prompt_logprobs holds 6 ids"), std::string::npos)
        << e.what();
  }
}

// SampleResponse sequences=1; SampledSequence stop_reason=1 (LENGTH=1), tokens=2 (int32),
// logprobs=3 (float32), assembled by hand from the SDK descriptor.
TEST(TinkerWireSample, EncodesHandCheckedBytes) {
  tinker::sample_response r;
  r.sequences.push_back({"length", {5}, {-0.5}});
  EXPECT_EQ(encode_sample_response_proto(r),
            std::string("\x0a\x0e\x08\x01\x12\x04\x05\x00\x00\x00\x1a\x04\x00\x00\x00\xbf", 16));
}

TEST(TinkerWireSample, ProtoResponseRoundTrips) {
  const auto back = decode_sample_response_proto(encode_sample_response_proto(two_sequences()));
  ASSERT_EQ(back.sequences.size(), 2u);
  EXPECT_EQ(back.sequences[0].stop_reason, "stop");
  EXPECT_EQ(back.sequences[1].stop_reason, "length");
  EXPECT_EQ(back.sequences[0].tokens, (std::vector<int64_t>{5, 6, 2}));
  EXPECT_EQ(back.sequences[1].logprobs, (std::vector<double>{-2.0}));
  EXPECT_TRUE(back.has_prompt_logprobs);
  expect_user_error([] { decode_sample_response_proto("\x0a\x05\x12\x03xyz"); },
                    {"tokens has 3 bytes"});
}

TEST(TinkerWireSample, RefusesBrokenResults) {
  auto r = two_sequences();
  r.sequences[1].stop_reason = "eos";
  expect_error([&] { encode_sample_response_proto(r); }, tinker::error_category::server,
               {"sequence 1 has stop_reason \"eos\""});
  r = two_sequences();
  r.sequences[0].logprobs.pop_back();
  expect_error([&] { encode_sample_response_json(r); }, tinker::error_category::server,
               {"sequence 0 has 2 logprobs for 3 tokens"});
  r = two_sequences();
  r.sequences[1].tokens[0] = int64_t{1} << 33;
  r.sequences[1].logprobs = {0};
  expect_error([&] { encode_sample_response_proto(r); }, tinker::error_category::server,
               {"does not fit in int32"});
}

TEST(TinkerWireSample, JsonResponseHasNullFirstPromptLogprob) {
  const auto j = json::parse(encode_sample_response_json(two_sequences()));
  EXPECT_EQ(j["type"], "sample");
  ASSERT_EQ(j["sequences"].size(), 2u);
  EXPECT_EQ(j["sequences"][0]["stop_reason"], "stop");
  EXPECT_EQ(j["sequences"][0]["tokens"], json::array({5, 6, 2}));
  EXPECT_EQ(j["sequences"][1]["logprobs"], json::array({-2.0}));
  ASSERT_EQ(j["prompt_logprobs"].size(), 3u);
  EXPECT_TRUE(j["prompt_logprobs"][0].is_null());
  EXPECT_EQ(j["prompt_logprobs"][2], -4.5);
  auto plain = two_sequences();
  plain.has_prompt_logprobs = false;
  EXPECT_FALSE(json::parse(encode_sample_response_json(plain)).contains("prompt_logprobs"));
}

} // namespace
} // namespace rlforge::service::test
