#include "tests/service/wire_test_support.hpp"

#include "service/wire/json_bodies.hpp"

namespace rlforge::service::test {
namespace {

// -- the other JSON bodies ----------------------------------------------------------------------

TEST(TinkerWireBodies, SessionBodies) {
  const auto s = decode_create_session(
      R"({"tags":["a","b"],"user_metadata":{"who":"me","n":3},"sdk_version":"0.25.0",)"
      R"("type":"create_session"})");
  EXPECT_EQ(s.tags, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(s.user_metadata.at("who"), "me");
  EXPECT_EQ(s.user_metadata.at("n"), "3");
  EXPECT_EQ(s.sdk_version, "0.25.0");
  EXPECT_TRUE(s.project_id.empty());
  expect_user_error([] { decode_create_session(R"({"tags":"a"})"); },
                    {"create_session: 'tags' must be an array, got string"});
  expect_user_error([] { decode_create_session(R"({"tags":[1]})"); },
                    {"'tags' entry 0 must be a string"});
  expect_user_error([] { decode_create_session(R"({"user_metadata":[1]})"); },
                    {"'user_metadata' must be an object"});
  EXPECT_EQ(
      decode_session_heartbeat(R"({"session_id":"sess-1","type":"session_heartbeat"})").session_id,
      "sess-1");
  expect_user_error([] { decode_session_heartbeat("{}"); },
                    {"session_heartbeat: 'session_id' is required"});
  expect_user_error([] { decode_session_heartbeat(R"({"session_id":""})"); },
                    {"'session_id' must not be empty"});
  expect_user_error([] { decode_session_heartbeat("nope"); }, {"malformed JSON"});
}

TEST(TinkerWireBodies, CreateModel) {
  const auto m = decode_create_model(
      R"({"session_id":"sess-1","model_seq_id":0,"base_model":"toy","lora_config":{"rank":8,)"
      R"("seed":3,"train_unembed":false,"train_mlp":true,"train_attn":true},"type":"create_model"})");
  EXPECT_EQ(m.session_id, "sess-1");
  EXPECT_EQ(m.model_seq_id, 0);
  EXPECT_EQ(m.base_model, "toy");
  EXPECT_EQ(m.lora.rank, 8);
  EXPECT_TRUE(m.lora.has_seed);
  EXPECT_EQ(m.lora.seed, 3);
  EXPECT_FALSE(m.lora.train_unembed);
  EXPECT_TRUE(m.lora.train_mlp);
  EXPECT_EQ(m.role, tinker::model_role::policy);
  const auto c = decode_create_model(
      R"({"session_id":"s","model_seq_id":2,"base_model":"toy","model_role":"critic"})");
  EXPECT_EQ(c.lora.rank, 0);
  EXPECT_FALSE(c.lora.has_seed);
  EXPECT_EQ(c.role, tinker::model_role::critic);
  expect_user_error([] { decode_create_model(R"({"session_id":"s","model_seq_id":0})"); },
                    {"create_model: 'base_model' is required"});
  expect_user_error(
      [] {
        decode_create_model(
            R"({"session_id":"s","model_seq_id":0,"base_model":"b","lora_config":{"rank":-1}})");
      },
      {"'lora_config.rank' must be >= 0, got -1"});
  expect_user_error(
      [] {
        decode_create_model(
            R"({"session_id":"s","model_seq_id":0,"base_model":"b","lora_config":{}})");
      },
      {"'lora_config.rank' is required"});
  expect_user_error(
      [] {
        decode_create_model(
            R"({"session_id":"s","model_seq_id":0,"base_model":"b","model_role":"actor"})");
      },
      {"'model_role' is \"actor\", expected policy or critic"});
  expect_user_error(
      [] { decode_create_model(R"({"session_id":"s","model_seq_id":-1,"base_model":"b"})"); },
      {"'model_seq_id' must be >= 0"});
}

TEST(TinkerWireBodies, OptimStep) {
  const auto o = decode_optim_step(
      R"({"adam_params":{"learning_rate":0.001,"beta1":0.8,"beta2":0.99,"eps":1e-8,)"
      R"("weight_decay":0.1,"grad_clip_norm":1},"model_id":"m","seq_id":4,"type":"optim_step"})");
  EXPECT_EQ(o.model_id, "m");
  EXPECT_EQ(o.seq_id, 4);
  EXPECT_DOUBLE_EQ(o.adam.learning_rate, 0.001);
  EXPECT_DOUBLE_EQ(o.adam.beta1, 0.8);
  EXPECT_DOUBLE_EQ(o.adam.beta2, 0.99);
  EXPECT_DOUBLE_EQ(o.adam.eps, 1e-8);
  EXPECT_DOUBLE_EQ(o.adam.weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(o.adam.grad_clip_norm, 1.0);
  const auto d = decode_optim_step(R"({"adam_params":{},"model_id":"m","seq_id":0})");
  EXPECT_DOUBLE_EQ(d.adam.learning_rate, 1e-4);
  EXPECT_DOUBLE_EQ(d.adam.beta2, 0.95);
  EXPECT_DOUBLE_EQ(d.adam.eps, 1e-12);
  auto bad = [](const std::string& adam) {
    return R"({"model_id":"m","seq_id":1,"adam_params":)" + adam + "}";
  };
  expect_user_error([&] { decode_optim_step(bad(R"({"beta1":1.0})")); },
                    {"optim_step: 'adam_params.beta1' must be in [0, 1), got 1"});
  expect_user_error([&] { decode_optim_step(bad(R"({"learning_rate":-1})")); },
                    {"'adam_params.learning_rate' must be a finite number >= 0"});
  expect_user_error([&] { decode_optim_step(bad(R"({"eps":0})")); }, {"'adam_params.eps'"});
  expect_user_error([&] { decode_optim_step(bad(R"({"grad_clip_norm":"1"})")); },
                    {"'adam_params.grad_clip_norm' must be a number, got string"});
  // Numbers JSON cannot hold are named by field (Python's json writes NaN and Infinity).
  expect_user_error([&] { decode_optim_step(bad(R"({"weight_decay":1e400})")); },
                    {"optim_step: 'adam_params.weight_decay' is 1e400; numbers must be finite"});
  expect_user_error([&] { decode_optim_step(bad(R"({"beta1":0.9, "learning_rate": NaN})")); },
                    {"optim_step: 'adam_params.learning_rate' is NaN"});
  expect_user_error(
      [&] { decode_optim_step(bad(R"({"eps":1e-8,"learning_rate":-Infinity})")); },
      {"'adam_params.learning_rate' is -Infinity"});
  expect_user_error([] { decode_optim_step(R"({"model_id":"a\"b","x":[1,[2,Infinity]]})"); },
                    {"'x[1][1]' is Infinity"});
  expect_user_error([&] { decode_optim_step(bad(R"({"learning_rate":tru})")); },
                    {"optim_step: malformed JSON body"});
  expect_user_error([] { decode_optim_step(R"({"model_id":"m","seq_id":1})"); },
                    {"'adam_params' is required"});
  expect_user_error([] { decode_optim_step(R"({"model_id":"m","adam_params":{}})"); },
                    {"'seq_id' is required"});
}

TEST(TinkerWireBodies, SaveWeightsAndForSampler) {
  const auto s = decode_save_weights(
      R"({"model_id":"m","path":"step_000010","seq_id":5,"ttl_seconds":60,"overwrite":true})");
  EXPECT_EQ(s.path, "step_000010");
  EXPECT_TRUE(s.has_ttl);
  EXPECT_EQ(s.ttl_seconds, 60);
  EXPECT_TRUE(s.overwrite);
  for (const char* bad : {"../x", "a/b", ".hidden", "a b"})
    expect_user_error(
        [&] {
          decode_save_weights(std::string(R"({"model_id":"m","seq_id":1,"path":")") + bad + "\"}");
        },
        {"save_weights: 'path'", "is not a checkpoint name"});
  expect_user_error([] { decode_save_weights(R"({"model_id":"m","seq_id":1,"ttl_seconds":0})"); },
                    {"'ttl_seconds' must be >= 1, got 0"});
  const auto f = decode_save_weights_for_sampler(
      R"({"model_id":"m","seq_id":2,"sampling_session_seq_id":0,"type":"save_weights_for_sampler"})");
  EXPECT_TRUE(f.path.empty());
  EXPECT_TRUE(f.has_sampling_session_seq_id);
  EXPECT_EQ(f.sampling_session_seq_id, 0);
  EXPECT_FALSE(f.has_ttl);
  const auto p = decode_save_weights_for_sampler(R"({"model_id":"m","seq_id":2,"path":"final"})");
  EXPECT_EQ(p.path, "final");
  EXPECT_FALSE(p.has_sampling_session_seq_id);
  expect_user_error(
      [] { decode_save_weights_for_sampler(R"({"model_id":"m","seq_id":2,"path":"x/../../y"})"); },
      {"save_weights_for_sampler: 'path'"});
  expect_user_error([] { decode_save_weights_for_sampler(R"({"seq_id":2})"); },
                    {"'model_id' is required"});
}

TEST(TinkerWireBodies, LoadWeightsInBothAddressingModes) {
  const auto l = decode_load_weights(
      R"({"model_id":"m","seq_id":1,"path":"tinker://run/weights/a","optimizer":true})");
  EXPECT_FALSE(l.create_via_load);
  EXPECT_EQ(l.model_id, "m");
  EXPECT_EQ(l.seq_id, 1);
  EXPECT_TRUE(l.optimizer);
  const auto c = decode_load_weights(
      R"({"session_id":"s","model_seq_id":1,"base_model":"toy","path":"tinker://run/weights/a",)"
      R"("optimizer":false})");
  EXPECT_TRUE(c.create_via_load);
  EXPECT_EQ(c.session_id, "s");
  EXPECT_EQ(c.model_seq_id, 1);
  EXPECT_EQ(c.base_model, "toy");
  expect_user_error(
      [] {
        decode_load_weights(
            R"({"model_id":"m","seq_id":1,"session_id":"s","model_seq_id":1,"path":"tinker://a","optimizer":true})");
      },
      {"not both"});
  expect_user_error([] { decode_load_weights(R"({"path":"tinker://a","optimizer":true})"); },
                    {"are required"});
  expect_user_error(
      [] { decode_load_weights(R"({"model_id":"m","seq_id":1,"path":"/etc","optimizer":true})"); },
      {"'path' must start with tinker://"});
  expect_user_error(
      [] { decode_load_weights(R"({"model_id":"m","seq_id":1,"path":"tinker://a"})"); },
      {"'optimizer' is required"});
  expect_user_error(
      [] { decode_load_weights(R"({"model_id":"m","path":"tinker://a","optimizer":true})"); },
      {"'seq_id' is required"});
}

TEST(TinkerWireBodies, SamplingSessionFutureAndInfoBodies) {
  const auto s = decode_create_sampling_session(
      R"({"session_id":"s","sampling_session_seq_id":3,"model_path":"tinker://r/sampler_weights/x"})");
  EXPECT_EQ(s.sampling_session_seq_id, 3);
  EXPECT_EQ(s.model_path, "tinker://r/sampler_weights/x");
  EXPECT_EQ(decode_create_sampling_session(
                R"({"session_id":"s","sampling_session_seq_id":0,"base_model":"toy"})")
                .base_model,
            "toy");
  expect_user_error(
      [] { decode_create_sampling_session(R"({"session_id":"s","sampling_session_seq_id":0})"); },
      {"one of 'model_path' or 'base_model' is required"});
  expect_user_error(
      [] {
        decode_create_sampling_session(
            R"({"session_id":"s","sampling_session_seq_id":0,"model_path":"tinker://"})");
      },
      {"'model_path' must start with tinker://"});

  const auto f = decode_retrieve_future(R"({"request_id":"req-9","allow_metadata_only":true})");
  EXPECT_EQ(f.request_id, "req-9");
  EXPECT_TRUE(f.allow_metadata_only);
  EXPECT_FALSE(decode_retrieve_future(R"({"request_id":"r"})").allow_metadata_only);
  expect_user_error([] { decode_retrieve_future(R"({"request_id":5})"); },
                    {"retrieve_future: 'request_id' must be a string, got number"});
  expect_user_error(
      [] { decode_retrieve_future(R"({"request_id":"r","allow_metadata_only":"yes"})"); },
      {"'allow_metadata_only' must be a boolean"});

  EXPECT_EQ(decode_weights_info(R"({"tinker_path":"tinker://r/weights/a"})").tinker_path,
            "tinker://r/weights/a");
  expect_user_error([] { decode_weights_info(R"({"tinker_path":"r/weights/a"})"); },
                    {"weights_info: 'tinker_path' must start with tinker://"});
  EXPECT_EQ(decode_get_info(R"({"model_id":"m","type":"get_info"})").model_id, "m");
  expect_user_error([] { decode_get_info(R"({"model_id":"m","type":"unload_model"})"); },
                    {"get_info: 'type' is \"unload_model\""});
  EXPECT_EQ(decode_unload_model(R"({"model_id":"m","type":"unload_model"})").model_id, "m");
  expect_user_error([] { decode_unload_model(R"({"model_id":null})"); },
                    {"unload_model: 'model_id' is required"});
}

} // namespace
} // namespace rlforge::service::test
