// http_server: the SDK's start-up sequence, authentication, body limits, bad input, the direct
// endpoints and content negotiation (over a recording test backend, loopback, ephemeral ports).
#include "tests/service/server_test_support.hpp"

#include "service/wire/compression.hpp"
#include "service/wire/forward_backward_codec.hpp"
#include "service/wire/json_bodies.hpp"
#include "service/wire/sample_codec.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

namespace rlforge::service::test {
namespace {

using ServerProtocol = server_test;

TEST_F(ServerProtocol, AnswersTheSdkStartupSequence) {
  start();
  // 1. client/config is mandatory and must turn pyqwest off.
  auto r = client->post("client/config", R"({"sdk_version":"0.25.0"})");
  ASSERT_EQ(r.status, 200) << r.body;
  auto cfg = parse(r);
  EXPECT_EQ(cfg.at("use_pyqwest_transport"), false);
  EXPECT_EQ(cfg.at("pjwt_auth_enabled"), false);
  EXPECT_EQ(cfg.at("parallel_fwdbwd_chunks"), true);
  EXPECT_EQ(cfg.at("fwdbwd_max_chunk_len"), 1024);
  EXPECT_EQ(cfg.at("create_model_via_load_weights"), false);
  // 2. dynamic_config.
  r = client->post("client/dynamic_config", R"({"sdk_version":"0.25.0"})");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(parse(r).at("refresh_interval_sec"), 300);
  // 3. create_session, then heartbeat and telemetry.
  r = client->post("create_session", R"({"tags":[],"user_metadata":{},"sdk_version":"0.25.0",)"
                                     R"("type":"create_session"})");
  ASSERT_EQ(r.status, 200) << r.body;
  auto session = parse(r).at("session_id").get<std::string>();
  EXPECT_EQ(session.rfind("sess-", 0), 0u);
  r = client->post("session_heartbeat",
                   json{{"session_id", session}, {"type", "session_heartbeat"}}.dump());
  EXPECT_EQ(r.status, 200) << r.body;
  r = client->post("telemetry", R"({"events":[],"platform":"Linux","sdk_version":"0.25.0"})");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(parse(r).at("status"), "accepted");
  // Capabilities and health.
  r = client->get("get_server_capabilities");
  ASSERT_EQ(r.status, 200);
  auto models = parse(r).at("supported_models");
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0].at("model_name"), "test-base");
  EXPECT_EQ(models[0].at("max_context_length"), test_backend::context);
  tinker_client anonymous("127.0.0.1", server->port(), "");
  r = anonymous.get("healthz");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(parse(r).at("status"), "ok");
  // The first training call: create_model (future), then the model's info.
  tinker::lora_config lora;
  lora.rank = 8;
  auto model = client->create_model(session, 0, "test-base", lora);
  EXPECT_EQ(model, session + ":train:0");
  r = client->post("get_info", json{{"model_id", model}, {"type", "get_info"}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(parse(r).at("lora_rank"), 8);
  EXPECT_EQ(parse(r).at("is_lora"), true);
  EXPECT_EQ(parse(r).at("model_data").at("model_name"), "test-base");
  // No tokenizer: no tokenizer_id. With one, where AutoTokenizer.from_pretrained would load it.
  EXPECT_FALSE(parse(r).at("model_data").contains("tokenizer_id")) << r.body;
  backend.set_tokenizer_id("models/test-base");
  r = client->post("get_info", json{{"model_id", model}, {"type", "get_info"}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(parse(r).at("model_data").at("tokenizer_id"), "models/test-base");
  EXPECT_EQ(backend.calls(), (std::vector<std::string>{"create:" + model}));
}

TEST_F(ServerProtocol, RefusesMissingOrWrongApiKeyAndRunsNothing) {
  start();
  auto session = client->create_session();
  auto body = json{{"session_id", session},
                   {"model_seq_id", 0},
                   {"base_model", "test-base"},
                   {"lora_config", {{"rank", 4}}},
                   {"type", "create_model"}}
                  .dump();
  tinker_client nokey("127.0.0.1", server->port(), "");
  auto r = nokey.post("create_model", body);
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(error_of(r),
            "missing API key: send header X-API-Key: KEY or Authorization: Bearer KEY");
  tinker_client wrong("127.0.0.1", server->port(), "test-key-124");
  r = wrong.post("create_model", body);
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(error_of(r), "invalid API key");
  r = wrong.get("get_server_capabilities");
  EXPECT_EQ(r.status, 401);
  tinker_client prefix("127.0.0.1", server->port(), "test-key-12");
  EXPECT_EQ(prefix.post("create_session", "{}").status, 401);
  // Nothing executed and nothing was recorded.
  EXPECT_TRUE(backend.calls().empty());
  EXPECT_EQ(store->count_futures(future_state::pending) +
                store->count_futures(future_state::complete) +
                store->count_futures(future_state::failed),
            0u);
  // The right key still works afterwards.
  EXPECT_EQ(client->post("create_model", body).status, 200);
}

TEST_F(ServerProtocol, ConstantTimeEqualComparesWholeStrings) {
  EXPECT_TRUE(constant_time_equal("abc", "abc"));
  EXPECT_FALSE(constant_time_equal("abd", "abc"));
  EXPECT_FALSE(constant_time_equal("ab", "abc"));
  EXPECT_FALSE(constant_time_equal("abcd", "abc"));
  EXPECT_FALSE(constant_time_equal("", "abc"));
  EXPECT_TRUE(constant_time_equal("", ""));
}

TEST_F(ServerProtocol, RefusesBodiesOverTheLimitWith413) {
  opts.max_body_bytes = 4096;
  start();
  auto session = client->create_session();
  std::string big = json{{"session_id", session}, {"pad", std::string(5000, 'x')}}.dump();
  auto r = client->post("session_heartbeat", big);
  EXPECT_EQ(r.status, 413);
  EXPECT_EQ(error_of(r), "request body larger than the limit of 4096 bytes");
  // The server keeps serving, also on a body just under the limit.
  r = client->post("session_heartbeat", json{{"session_id", session}}.dump());
  EXPECT_EQ(r.status, 200) << r.body;
}

TEST_F(ServerProtocol, BadInputIsAClientErrorAndTheServerKeepsServing) {
  start();
  auto model = make_model();
  auto before = backend.calls().size();
  struct bad_case {
    std::string endpoint, body, content_type;
    int status;
    std::string expect; ///< substring of the error message
  };
  auto fb_proto = [&](tinker::forward_backward_request r) {
    return encode_forward_backward_request_proto(r);
  };
  // Syntax only here: what a model accepts (losses, token ids, inputs) is the backend's to check
  // (tests/actors/dispatcher_backend_test.cpp, tests/tinker).
  auto bad_tensor = fb(model, 1);
  bad_tensor.data[0].loss_fn_inputs["weights"].floats.pop_back(); // shape says 3
  auto no_loss = fb(model, 1);
  no_loss.loss_fn.clear();
  auto unknown_model = fb("sess-nope:train:0", 1);
  std::vector<bad_case> cases = {
      {"create_model", "{not json", "application/json", 400, ""},
      {"create_model", "[1,2]", "application/json", 400, ""},
      {"create_model",
       json{{"session_id", "sess-missing"}, {"model_seq_id", 0}, {"base_model", "test-base"}}
           .dump(),
       "application/json", 404, "unknown session 'sess-missing'"},
      {"create_model",
       json{{"session_id", model.substr(0, model.find(':'))},
            {"model_seq_id", 1},
            {"base_model", "other-base"}}
           .dump(),
       "application/json", 400, "base_model 'other-base' is not served here"},
      {"forward_backward", "\xff\xff\xff garbage", "application/x-protobuf", 400, ""},
      {"forward_backward", fb_proto(bad_tensor), "application/x-protobuf", 400, "weights"},
      {"forward_backward", fb_proto(no_loss), "application/x-protobuf", 400, "loss_fn"},
      {"forward_backward", fb_proto(unknown_model), "application/x-protobuf", 404,
       "unknown model 'sess-nope:train:0'"},
      {"forward_backward", fb_proto(fb(model, 1)), "text/plain", 400, "text/plain"},
      {"optim_step", json{{"model_id", model}, {"seq_id", 1}}.dump(), "application/json", 400,
       "adam_params"},
      {"optim_step",
       json{{"model_id", "nope"}, {"seq_id", 1}, {"adam_params", {{"learning_rate", 1e-4}}}}.dump(),
       "application/json", 404, "unknown model 'nope'"},
      {"retrieve_future", json{{"request_id", "req-unknown"}}.dump(), "application/json", 404,
       "unknown request_id 'req-unknown'"},
      {"session_heartbeat", json{{"session_id", "sess-unknown"}}.dump(), "application/json", 404,
       "sess-unknown"},
      {"asample", tinker_client::sample_body("samp-unknown", 0, {1, 2}, 1, 4), "application/json",
       404, "unknown sampling session 'samp-unknown'"},
      {"load_weights",
       json{{"model_id", model},
            {"seq_id", 1},
            {"path", "tinker://" + model + "/weights/none"},
            {"optimizer", false}}
           .dump(),
       "application/json", 404, "unknown checkpoint"},
      {"load_weights",
       json{
           {"model_id", model}, {"seq_id", 1}, {"path", "file:///etc/passwd"}, {"optimizer", false}}
           .dump(),
       "application/json", 400, "tinker://"},
      {"get_info", json{{"model_id", "nope"}}.dump(), "application/json", 404,
       "unknown model 'nope'"},
      {"weights_info", json{{"tinker_path", "tinker://x/weights/y"}}.dump(), "application/json",
       404, "unknown checkpoint"},
  };
  for (auto& c : cases) {
    auto r = client->post(c.endpoint, c.body, c.content_type);
    EXPECT_EQ(r.status, c.status) << c.endpoint << ": " << r.body;
    ASSERT_FALSE(r.body.empty()) << c.endpoint;
    auto msg = error_of(r);
    EXPECT_FALSE(msg.empty()) << c.endpoint;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.endpoint << ": " << msg;
  }
  EXPECT_EQ(client->get("no_such_endpoint").status, 404);
  EXPECT_EQ(client->get("samplers/samp-unknown").status, 404);
  EXPECT_EQ(client->get("training_runs?limit=-1").status, 400);
  auto projects = client->get("training_runs?project_id=p1");
  EXPECT_EQ(projects.status, 400);
  EXPECT_EQ(error_of(projects), "project_id: rlforge serve has no projects; list without it");
  // Nothing reached the backend. The refused requests used seq_id 1 up (the SDK counts it), so
  // the model goes on with seq_id 2 at once, without waiting for the gap timeout.
  EXPECT_EQ(backend.calls().size(), before);
  auto out = client->forward_backward(fb(model, 2));
  EXPECT_EQ(out.metrics.at("loss:sum"), 2.0);
  auto r = client->post("forward_backward", fb_proto(fb(model, 1)), "application/x-protobuf");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(error_of(r).find("already passed"), std::string::npos);
}

TEST_F(ServerProtocol, ARequestWhoseBodyDoesNotDecodeStillUsesUpItsSeqId) {
  opts.scheduler.gap_timeout = 120s; // a stall would outlast the test's deadline
  start();
  auto model = make_model();
  // The SDK sends a bare NaN literal for a NaN learning rate: not JSON, refused, seq 1 used up.
  auto nan_body = "{\"adam_params\": {\"learning_rate\": NaN, \"beta1\": 0.9}, \"model_id\": \"" +
                  model + "\", \"seq_id\": 1, \"type\": \"optim_step\"}";
  auto r = client->post("optim_step", nan_body, "application/json");
  EXPECT_EQ(r.status, 400) << r.body;
  // A zstd-compressed protobuf body that is corrupt after its ids: refused, seq 2 used up.
  auto proto = encode_forward_backward_request_proto(fb(model, 2));
  auto cut = zstd_compress(proto.substr(0, proto.size() - 3) + std::string("\xff\xff\xff", 3));
  std::map<std::string, std::string> headers{{"Content-Encoding", "zstd"}};
  r = client->post("forward_backward", cut, "application/x-protobuf", headers);
  EXPECT_EQ(r.status, 400) << r.body;
  // The next valid request runs at once, without waiting for the gap timeout.
  auto start_time = std::chrono::steady_clock::now();
  EXPECT_EQ(client->forward_backward(fb(model, 3)).metrics.at("loss:sum"), 3.0);
  EXPECT_LT(std::chrono::steady_clock::now() - start_time, 60s);
}

TEST_F(ServerProtocol, FailedOperationsAnswerErrorAndCategory) {
  start();
  auto model = make_model();
  backend.fail_next(tinker::error_category::user, "datum 0: sequence too long for this backend");
  auto id = client->submit_forward_backward(fb(model, 1));
  auto r = client->wait_future(id, true);
  ASSERT_EQ(r.status, 200);
  auto j = parse(r);
  EXPECT_EQ(j.at("error"), "datum 0: sequence too long for this backend");
  EXPECT_EQ(j.at("category"), "user");
  backend.fail_next(tinker::error_category::server, "worker died");
  id = client->submit_forward_backward(fb(model, 2));
  j = parse(client->wait_future(id, true));
  EXPECT_EQ(j.at("category"), "server");
  // The model keeps training.
  EXPECT_EQ(client->forward_backward(fb(model, 3)).metrics.at("loss:sum"), 3.0);
}

TEST_F(ServerProtocol, AFailedCreateLeavesNoModel) {
  start();
  auto session = client->create_session();
  backend.fail_next(tinker::error_category::user, "lora rank 4096 exceeds the hidden size");
  tinker::lora_config lora;
  lora.rank = 4096;
  try {
    client->create_model(session, 0, "test-base", lora);
    FAIL() << "create_model succeeded";
  } catch (const client_error& e) {
    EXPECT_EQ(e.category(), "user");
    EXPECT_STREQ(e.what(), "lora rank 4096 exceeds the hidden size");
  }
  auto model = session + ":train:0";
  auto r = client->post("forward_backward", encode_forward_backward_request_proto(fb(model, 1)),
                        "application/x-protobuf");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(client->post("get_info", json{{"model_id", model}}.dump()).status, 404);
  // The next model of the session is created normally.
  lora.rank = 4;
  EXPECT_EQ(client->create_model(session, 1, "test-base", lora), session + ":train:1");
}

TEST_F(ServerProtocol, ResultsAreProtobufWhenAcceptedAndJsonOtherwise) {
  start();
  auto model = make_model();
  auto id = client->submit_forward_backward(fb(model, 1, {5, 6, 7, 8}));
  auto proto = client->wait_future(id, true);
  ASSERT_EQ(proto.status, 200);
  EXPECT_EQ(proto.content_type, "application/x-protobuf");
  auto out = decode_forward_backward_output_proto(proto.body);
  ASSERT_EQ(out.loss_fn_outputs.size(), 1u);
  EXPECT_EQ(out.loss_fn_outputs[0].at("logprobs").floats, (std::vector<double>(4, -1.0)));
  auto js = client->wait_future(id, false);
  ASSERT_EQ(js.status, 200);
  EXPECT_EQ(js.content_type.rfind("application/json", 0), 0u);
  auto j = parse(js);
  EXPECT_EQ(j.at("metrics").at("loss:sum"), 1.0);
  EXPECT_EQ(j.at("loss_fn_outputs")[0].at("logprobs").at("data").size(), 4u);
  // Older SDKs send JSON forward_backward bodies; the forward endpoint sets forward_only.
  json body{
      {"model_id", model},
      {"seq_id", 2},
      {"forward_input",
       {{"data",
         json::array(
             {{{"model_input",
                {{"chunks", json::array({{{"tokens", {1, 2}}, {"type", "encoded_text"}}})}}},
               {"loss_fn_inputs",
                {{"target_tokens", {{"data", {2, 3}}, {"dtype", "int64"}, {"shape", {2}}}}}}}})},
        {"loss_fn", "cross_entropy"}}}};
  auto r = client->post("forward", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  auto fwd = client->wait_future(tinker_client::request_id_of(r), false);
  EXPECT_EQ(parse(fwd).at("metrics").at("loss:sum"), 2.0);
  EXPECT_EQ(backend.calls().back(), "fwd:" + model + ":2");
}

TEST_F(ServerProtocol, SamplesFromTheBaseModelAndSavedSamplerWeights) {
  start();
  auto model = make_model();
  auto session = model.substr(0, model.find(':'));
  auto base = client->create_sampling_session(session, 0, "", "test-base");
  auto r = client->get("samplers/" + base);
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(parse(r).at("base_model"), "test-base");
  auto s = client->sample(base, 0, {7, 8, 9}, 2, 3);
  ASSERT_EQ(s.sequences.size(), 2u);
  EXPECT_EQ(s.sequences[0].tokens, (std::vector<int64_t>{7, 7, 7}));
  EXPECT_EQ(s.sequences[0].logprobs, (std::vector<double>{-0.5, -0.5, -0.5}));
  EXPECT_EQ(s.sequences[0].stop_reason, "length");
  auto path = client->save_weights_for_sampler(model, 1, "s1");
  EXPECT_EQ(path, "tinker://" + model + "/sampler_weights/s1");
  auto trained = client->create_sampling_session(session, 1, path, "");
  r = client->get("samplers/" + trained);
  EXPECT_EQ(parse(r).at("model_path"), path);
  client->sample(trained, 0, {3}, 1, 1);
  // A saved sampler checkpoint is sampled from its export, not from the model's live weights.
  auto calls = backend.calls();
  EXPECT_EQ(calls.back(), "sample:" + path + ":1");
  // JSON results for older SDKs.
  auto id = tinker_client::request_id_of(
      client->post("asample", tinker_client::sample_body(trained, 1, {4}, 1, 2)));
  auto j = parse(client->wait_future(id, false));
  EXPECT_EQ(j.at("sequences")[0].at("tokens"), json::array({4, 4}));
  // Ephemeral sampler weights hand out a sampling session bound to a snapshot.
  r = client->post("save_weights_for_sampler",
                   json{{"model_id", model}, {"seq_id", 2}, {"sampling_session_seq_id", 2}}.dump());
  auto eph = parse(client->wait_future(tinker_client::request_id_of(r), false));
  EXPECT_EQ(eph.at("sampling_session_id").get<std::string>().rfind("samp-", 0), 0u);
  client->sample(eph.at("sampling_session_id"), 0, {3}, 1, 1);
  EXPECT_EQ(backend.calls().back(), "sample:" + model + "@1:1");
  // A training checkpoint is not a sampler.
  auto state = client->save_weights(model, 3, "w1");
  r = client->post(
      "create_sampling_session",
      json{{"session_id", session}, {"sampling_session_seq_id", 3}, {"model_path", state}}.dump());
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(error_of(r).find("training state"), std::string::npos);
}

TEST_F(ServerProtocol, SamplerCheckpointsKeepTheirWeightsAfterLaterSavesAndUnload) {
  // The SDK's RL loop: save_weights_for_sampler(name) + create_sampling_client(path) per step.
  // Each session must sample the checkpoint it names, also once the model trained on, saved
  // again or went away (after a restart the model is not loaded, its checkpoints still are).
  start();
  auto model = make_model();
  auto session = model.substr(0, model.find(':'));
  auto p1 = client->save_weights_for_sampler(model, 1, "step1");
  auto p2 = client->save_weights_for_sampler(model, 2, "step2");
  auto s1 = client->create_sampling_session(session, 0, p1, "");
  client->sample(s1, 0, {3}, 1, 1);
  EXPECT_EQ(backend.calls().back(), "sample:" + p1 + ":1");
  // Session-less asample with a model_path (older SDKs) samples that checkpoint too.
  json body = json::parse(tinker_client::sample_body("", 0, {4}, 1, 1));
  body.erase("sampling_session_id");
  body.erase("seq_id");
  body["model_path"] = p2;
  auto r = client->post("asample", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  client->wait_future(tinker_client::request_id_of(r), false);
  EXPECT_EQ(backend.calls().back(), "sample:" + p2 + ":1");
  // ... but not a training checkpoint: 400, nothing sampled.
  auto state = client->save_weights(model, 3, "w1");
  body["model_path"] = state;
  const auto before = backend.calls().size();
  r = client->post("asample", body.dump());
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(error_of(r).find("training state"), std::string::npos) << r.body;
  EXPECT_EQ(backend.calls().size(), before);
  // Unloading the model leaves its sampler checkpoints sampleable.
  r = client->post("unload_model", json{{"model_id", model}, {"type", "unload_model"}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  client->wait_future(tinker_client::request_id_of(r), false);
  client->sample(s1, 1, {5}, 1, 1);
  EXPECT_EQ(backend.calls().back(), "sample:" + p1 + ":1");
}

TEST_F(ServerProtocol, EphemeralSamplersStayBoundToTheWeightsTheyWereCreatedFrom) {
  // save_weights_and_get_sampling_client: every sampler names the snapshot it was created from;
  // an older one keeps sampling its own weights after later steps and saves.
  start();
  auto model = make_model();
  auto save = [&](int64_t seq) {
    auto r = client->post(
        "save_weights_for_sampler",
        json{{"model_id", model}, {"seq_id", seq}, {"sampling_session_seq_id", seq}}.dump());
    return parse(client->wait_future(tinker_client::request_id_of(r), false))
        .at("sampling_session_id")
        .get<std::string>();
  };
  auto first = save(1);
  client->forward_backward(fb(model, 2));
  auto second = save(3);
  client->sample(first, 0, {3}, 1, 1);
  EXPECT_EQ(backend.calls().back(), "sample:" + model + "@1:1");
  client->sample(second, 0, {3}, 1, 1);
  EXPECT_EQ(backend.calls().back(), "sample:" + model + "@2:1");
  client->sample(first, 1, {3}, 1, 1);
  EXPECT_EQ(backend.calls().back(), "sample:" + model + "@1:1");
}

TEST_F(ServerProtocol, NumSamplesAboveTheCapIsRefusedNamingTheLimit) {
  opts.max_num_samples = 8;
  start();
  auto session = client->create_session();
  auto base = client->create_sampling_session(session, 0, "", "test-base");
  auto r = client->post("asample", tinker_client::sample_body(base, 0, {1}, 9, 2));
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(error_of(r).find("num_samples 9 exceeds this server's limit of 8"), std::string::npos)
      << r.body;
  EXPECT_EQ(client->sample(base, 1, {1}, 8, 2).sequences.size(), 8u);
}

TEST_F(ServerProtocol, ListsSessionsAndTheirTrainingRunsAndSamplers) {
  // The SDK's RestClient.list_sessions / get_session.
  start();
  auto model = make_model();
  auto session = model.substr(0, model.find(':'));
  auto other = client->create_session();
  auto sampler = client->create_sampling_session(session, 0, "", "test-base");
  auto r = client->get("sessions");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(parse(r).at("sessions"), json::array({session, other}));
  EXPECT_EQ(parse(r).at("cursor").at("total_count"), 2);
  r = client->get("sessions?limit=1&offset=1");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(parse(r).at("sessions"), json::array({other}));
  r = client->get("sessions/" + session + "?access_scope=owned");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(parse(r).at("training_run_ids"), json::array({model}));
  EXPECT_EQ(parse(r).at("sampler_ids"), json::array({sampler}));
  r = client->get("sessions/" + other);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(parse(r).at("training_run_ids"), json::array());
  EXPECT_EQ(parse(r).at("sampler_ids"), json::array());
  // Bad input: unknown session, bad scope, bad paging.
  r = client->get("sessions/sess-nope");
  EXPECT_EQ(r.status, 404);
  EXPECT_NE(error_of(r).find("sess-nope"), std::string::npos) << r.body;
  r = client->get("sessions/" + session + "?access_scope=everyone");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(error_of(r).find("access_scope"), std::string::npos) << r.body;
  r = client->get("sessions?limit=-1");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(error_of(r).find("limit"), std::string::npos) << r.body;
  tinker_client anonymous("127.0.0.1", server->port(), "");
  EXPECT_EQ(anonymous.get("sessions").status, 401);
}

TEST_F(ServerProtocol, SavesListsDownloadsAndDeletesCheckpoints) {
  start();
  auto model = make_model();
  auto path = client->save_weights(model, 1, "step1");
  EXPECT_EQ(path, "tinker://" + model + "/weights/step1");
  // Same name again without overwrite: the future fails, nothing is overwritten.
  auto r = client->post("save_weights",
                        json{{"model_id", model}, {"seq_id", 2}, {"path", "step1"}}.dump());
  auto j = parse(client->wait_future(tinker_client::request_id_of(r), false));
  EXPECT_NE(j.at("error").get<std::string>().find("exists"), std::string::npos);
  client->load_weights(model, 3, path, true);
  EXPECT_EQ(backend.calls().back(), "load:" + model);
  r = client->post("weights_info", json{{"tinker_path", path}}.dump());
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(parse(r).at("lora_rank"), 4);
  EXPECT_EQ(parse(r).at("base_model"), "test-base");
  // Listing.
  r = client->get("training_runs/" + model + "/checkpoints");
  ASSERT_EQ(r.status, 200) << r.body;
  auto cps = parse(r).at("checkpoints");
  ASSERT_EQ(cps.size(), 1u);
  EXPECT_EQ(cps[0].at("checkpoint_id"), "weights/step1");
  EXPECT_EQ(cps[0].at("checkpoint_type"), "training");
  EXPECT_EQ(cps[0].at("tinker_path"), path);
  r = client->get("training_runs?limit=10&offset=0");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(parse(r).at("cursor").at("total_count"), 1);
  EXPECT_EQ(parse(r).at("training_runs")[0].at("training_run_id"), model);
  EXPECT_EQ(parse(r).at("training_runs")[0].at("last_checkpoint").at("tinker_path"), path);
  r = client->get("training_runs/" + model);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(client->get("training_runs/nope").status, 404);
  r = client->get("checkpoints");
  EXPECT_EQ(parse(r).at("checkpoints").size(), 1u);
  // Archive: a redirect to a short-lived URL that streams a tar of the checkpoint.
  r = client->get("training_runs/" + model + "/checkpoints/weights/step1/archive");
  ASSERT_EQ(r.status, 302) << r.body;
  auto location = r.headers.at("Location");
  EXPECT_FALSE(r.headers.at("Expires").empty());
  auto tar = client->get_url(location);
  ASSERT_EQ(tar.status, 200);
  EXPECT_EQ(tar.content_type, "application/x-tar");
  auto weights = std::string("weights of ") + model;
  EXPECT_NE(tar.body.find("state.bin"), std::string::npos);
  EXPECT_NE(tar.body.find(weights), std::string::npos);
  EXPECT_EQ(tar.body.size() % 512, 0u);
  auto forged = location;
  forged.back() = forged.back() == '0' ? '1' : '0';
  EXPECT_EQ(client->get_url(forged).status, 404);
  // Delete, then it is gone.
  r = client->del("training_runs/" + model + "/checkpoints/weights/step1");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(client->del("training_runs/" + model + "/checkpoints/weights/step1").status, 404);
  EXPECT_EQ(parse(client->get("training_runs/" + model + "/checkpoints")).at("checkpoints").size(),
            0u);
  EXPECT_EQ(client->get_url(location).status, 404);
}

TEST_F(ServerProtocol, AnAbortedArchiveDownloadLeavesTheServerServing) {
  start();
  auto model = make_model();
  client->save_weights(model, 1, "big");
  // 16 MiB more than the socket buffers hold, so the server is still sending when we hang up.
  auto dir = std::filesystem::path(opts.checkpoint_dir) / model / "weights" / "big";
  std::ofstream(dir / "blob.bin", std::ios::binary) << std::string(16 << 20, 'x');
  auto r = client->get("training_runs/" + model + "/checkpoints/weights/big/archive");
  ASSERT_EQ(r.status, 302);
  auto location = r.headers.at("Location");
  auto path = location.substr(location.find("/api/"));
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  std::string get = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  ASSERT_EQ(send(fd, get.data(), get.size(), 0), static_cast<ssize_t>(get.size()));
  char buf[4096];
  ASSERT_GT(recv(fd, buf, sizeof(buf), 0), 0);
  close(fd);
  std::this_thread::sleep_for(100ms);
  // Still alive and serving, also a complete download of the same archive.
  EXPECT_EQ(client->get("get_server_capabilities").status, 200);
  auto tar = client->get_url(location);
  ASSERT_EQ(tar.status, 200);
  EXPECT_GT(tar.body.size(), size_t{16} << 20);
}

TEST_F(ServerProtocol, CheckpointsPastTheirTtlAreRemoved) {
  start();
  auto model = make_model();
  auto r = client->post(
      "save_weights",
      json{{"model_id", model}, {"seq_id", 1}, {"path", "short"}, {"ttl_seconds", 1}}.dump());
  auto path = parse(client->wait_future(tinker_client::request_id_of(r), false)).at("path");
  auto keep = client->save_weights(model, 2, "kept");
  auto dir = std::filesystem::path(opts.checkpoint_dir) / model / "weights";
  ASSERT_TRUE(std::filesystem::exists(dir / "short" / "state.bin"));
  std::this_thread::sleep_for(1100ms);
  auto cps = parse(client->get("training_runs/" + model + "/checkpoints")).at("checkpoints");
  ASSERT_EQ(cps.size(), 1u);
  EXPECT_EQ(cps[0].at("tinker_path"), keep);
  EXPECT_FALSE(std::filesystem::exists(dir / "short"));
  EXPECT_TRUE(std::filesystem::exists(dir / "kept" / "state.bin"));
  r = client->post("weights_info", json{{"tinker_path", path}}.dump());
  EXPECT_EQ(r.status, 404);
}

TEST_F(ServerProtocol, SetsAndClearsACheckpointTtl) {
  // The SDK's RestClient.set_checkpoint_ttl_from_tinker_path.
  start();
  auto model = make_model();
  auto path = client->save_weights(model, 1, "w");
  const std::string ttl_path = "training_runs/" + model + "/checkpoints/weights/w/ttl";
  auto listed = [&] {
    return parse(client->get("training_runs/" + model + "/checkpoints")).at("checkpoints").at(0);
  };
  EXPECT_FALSE(listed().contains("expires_at"));
  auto r = client->put(ttl_path, R"({"ttl_seconds": 3600})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(listed().contains("expires_at"));
  EXPECT_EQ(listed().at("tinker_path"), path);
  r = client->put(ttl_path, R"({"ttl_seconds": null})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_FALSE(listed().contains("expires_at"));
  // Bad input is 400/404 naming what is wrong, and the checkpoint keeps its (absent) expiry.
  for (const char* bad : {R"({"ttl_seconds": 0})", R"({"ttl_seconds": -5})",
                          R"({"ttl_seconds": 1.5})", R"({"ttl_seconds": "60"})"}) {
    r = client->put(ttl_path, bad);
    EXPECT_EQ(r.status, 400) << bad;
    EXPECT_NE(error_of(r).find("'ttl_seconds' is"), std::string::npos) << r.body;
  }
  for (const char* bad : {"{}", "[]", "not json"}) {
    r = client->put(ttl_path, bad);
    EXPECT_EQ(r.status, 400) << bad;
    EXPECT_NE(error_of(r).find("must be a JSON object"), std::string::npos) << r.body;
  }
  EXPECT_FALSE(listed().contains("expires_at"));
  r = client->put("training_runs/" + model + "/checkpoints/weights/nope/ttl",
                  R"({"ttl_seconds": 60})");
  EXPECT_EQ(r.status, 404);
  EXPECT_NE(error_of(r).find("weights/nope"), std::string::npos) << r.body;
  r = client->put("training_runs/nope/checkpoints/weights/w/ttl", R"({"ttl_seconds": 60})");
  EXPECT_EQ(r.status, 404);
  // A 1 s ttl set later expires the checkpoint like one saved with it.
  r = client->put(ttl_path, R"({"ttl_seconds": 1})");
  ASSERT_EQ(r.status, 200) << r.body;
  std::this_thread::sleep_for(1100ms);
  auto cps = parse(client->get("training_runs/" + model + "/checkpoints")).at("checkpoints");
  EXPECT_TRUE(cps.empty()) << cps.dump();
  tinker_client anonymous("127.0.0.1", server->port(), "");
  EXPECT_EQ(anonymous.put(ttl_path, R"({"ttl_seconds": 60})").status, 401);
}

// The SDK's REST methods the server does not support answer 400 naming the method and why (a 4xx:
// the SDK retries every 5xx), never a 404; the server keeps serving.
TEST_F(ServerProtocol, UnsupportedSdkMethodsAreRefusedNamingThem) {
  start();
  const std::string ckpt = "training_runs/run-1/checkpoints/weights/w1/publish";
  struct call {
    client_response r;
    std::string method;
  };
  std::vector<call> calls = {
      {client->get("audit?event_type=all"), "get_audit_log"},
      {client->post(ckpt, ""), "publish_checkpoint_from_tinker_path"},
      {client->del(ckpt), "unpublish_checkpoint_from_tinker_path"},
      {client->put("sessions/s1/project", R"({"project_id":"p"})"), "assign_session_project"},
      {client->get("sessions/s1/trace_export"), "export_session_trace"},
      {client->get("billing/usage/events?starting_on=2026-01-01T00:00:00Z"), "get_billing_usage"},
  };
  for (auto& c : calls) {
    EXPECT_EQ(c.r.status, 400) << c.method << ": " << c.r.body;
    EXPECT_EQ(c.r.headers["x-should-retry"], "false") << c.method;
    EXPECT_EQ(error_of(c.r).rfind(c.method + " is not supported by rlforge serve: ", 0), 0u)
        << error_of(c.r);
  }
  // Without the key they are refused before anything else.
  tinker_client nokey("127.0.0.1", server->port(), "");
  EXPECT_EQ(nokey.get("audit").status, 401);
  EXPECT_EQ(client->get("get_server_capabilities").status, 200);
}

TEST_F(ServerProtocol, UnloadModelFreesItAndLaterCallsAre404) {
  start();
  auto model = make_model();
  auto r = client->post("unload_model", json{{"model_id", model}, {"type", "unload_model"}}.dump());
  ASSERT_EQ(r.status, 200);
  auto j = parse(client->wait_future(tinker_client::request_id_of(r), false));
  EXPECT_EQ(j.at("model_id"), model);
  EXPECT_EQ(backend.calls().back(), "delete:" + model);
  r = client->post("forward_backward", encode_forward_backward_request_proto(fb(model, 1)),
                   "application/x-protobuf");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(client->post("get_info", json{{"model_id", model}}.dump()).status, 404);
}

TEST_F(ServerProtocol, RefusesBadOptions) {
  opts.checkpoint_dir = (dir.path() / "c").string();
  store = future_store::open(db_path());
  auto make = [&](server_options o) { http_server s(o, backend, *store); };
  auto o = opts;
  o.api_key.clear();
  EXPECT_THROW(make(o), std::invalid_argument);
  o.insecure_no_auth = true;
  EXPECT_NO_THROW(make(o));
  o = opts;
  o.checkpoint_dir.clear();
  EXPECT_THROW(make(o), std::invalid_argument);
  o = opts;
  o.long_poll_hold = 0ms;
  EXPECT_THROW(make(o), std::invalid_argument);
  o = opts;
  o.http_threads = 0;
  EXPECT_THROW(make(o), std::invalid_argument);
  o = opts;
  o.max_body_bytes = 0;
  EXPECT_THROW(make(o), std::invalid_argument);
  o = opts;
  o.port = 70000;
  EXPECT_THROW(make(o), std::invalid_argument);
  // A port in use is a clear start() error.
  http_server first(opts, backend, *store);
  int port = first.start();
  auto o2 = opts;
  o2.port = port;
  http_server second(o2, backend, *store);
  try {
    second.start();
    FAIL() << "bound a port in use";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(port)), std::string::npos) << e.what();
  }
}

TEST_F(ServerProtocol, InsecureModeServesWithoutAKey) {
  opts.api_key.clear();
  opts.insecure_no_auth = true;
  start();
  tinker_client anonymous("127.0.0.1", server->port(), "");
  EXPECT_EQ(anonymous.post("client/config", "{}").status, 200);
}

} // namespace
} // namespace rlforge::service::test
