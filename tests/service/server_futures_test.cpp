// http_server futures: seq_id ordering of out-of-order chunks, barriers, batching, idempotent
// retries and 409, long-polls, metadata-only polls, 429 backpressure, restarts.
#include "tests/service/server_test_support.hpp"

#include <future>
#include <thread>

#include "service/wire/forward_backward_codec.hpp"
#include "service/wire/json_bodies.hpp"
#include "service/wire/sample_codec.hpp"

namespace rlforge::service::test {
namespace {

using ServerFutures = server_test;

std::string proto_body(const tinker::forward_backward_request& r) {
  return encode_forward_backward_request_proto(r);
}

TEST_F(ServerFutures, ExecutesOutOfOrderChunksInSeqIdOrderAsOneBatch) {
  start();
  auto model = make_model();
  // As the SDK sends a chunked forward_backward: seq 2 and 3 first, the first chunk last.
  auto id3 = client->submit_forward_backward(fb(model, 3));
  auto id2 = client->submit_forward_backward(fb(model, 2));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(backend.calls().size(), 1u); // only the create: 2 and 3 wait for 1
  auto id1 = client->submit_forward_backward(fb(model, 1));
  for (auto& [id, seq] :
       std::vector<std::pair<std::string, double>>{{id1, 1}, {id2, 2}, {id3, 3}}) {
    auto r = client->wait_future(id, true);
    EXPECT_EQ(decode_forward_backward_output_proto(r.body).metrics.at("loss:sum"), seq);
  }
  EXPECT_EQ(backend.calls(),
            (std::vector<std::string>{"create:" + model, "fb:" + model + ":1,2,3"}));
}

TEST_F(ServerFutures, OptimStepIsABarrierBetweenBatches) {
  start();
  auto model = make_model();
  backend.hold(); // everything queues up behind a held call
  auto a = client->submit_forward_backward(fb(model, 1));
  ASSERT_TRUE(backend.wait_entered(2));
  auto b = client->submit_forward_backward(fb(model, 2));
  auto c = client->submit_forward_backward(fb(model, 3));
  auto optim = tinker_client::request_id_of(client->post(
      "optim_step",
      json{{"model_id", model}, {"seq_id", 4}, {"adam_params", {{"learning_rate", 0.01}}}}.dump()));
  auto d = client->submit_forward_backward(fb(model, 5));
  auto f = fb(model, 6);
  f.forward_only = true;
  auto e = tinker_client::request_id_of(
      client->post("forward_backward", proto_body(f), "application/x-protobuf"));
  backend.release();
  for (auto& id : {a, b, c, d, e})
    EXPECT_EQ(client->wait_future(id, true).content_type, "application/x-protobuf");
  auto metrics = parse(client->wait_future(optim, false)).at("metrics");
  EXPECT_EQ(metrics.at("learning_rate:mean"), 0.01);
  EXPECT_EQ(backend.calls(), (std::vector<std::string>{
                                 "create:" + model, "fb:" + model + ":1", "fb:" + model + ":2,3",
                                 "optim:" + model, "fb:" + model + ":5", "fwd:" + model + ":6"}));
}

TEST_F(ServerFutures, RetriesAreIdempotentAndConflictingRetriesAre409) {
  start();
  auto model = make_model();
  auto body = proto_body(fb(model, 1));
  std::map<std::string, std::string> key{{"X-Idempotency-Key", "stainless-python-retry-1"}};
  auto first = client->post("forward_backward", body, "application/x-protobuf", key);
  auto again = client->post("forward_backward", body, "application/x-protobuf", key);
  ASSERT_EQ(first.status, 200);
  EXPECT_EQ(tinker_client::request_id_of(first), tinker_client::request_id_of(again));
  // Same (model_id, seq_id) and body without the key: also the original future.
  auto plain = client->post("forward_backward", body, "application/x-protobuf");
  EXPECT_EQ(tinker_client::request_id_of(plain), tinker_client::request_id_of(first));
  // Requests are told apart by a SHA-256 of what they sent (a 64-bit hash could collide).
  auto stored = store->get(tinker_client::request_id_of(first));
  ASSERT_TRUE(stored);
  EXPECT_EQ(stored->payload_hash.rfind("sha256:", 0), 0u) << stored->payload_hash;
  EXPECT_EQ(stored->payload_hash.size(), 7u + 64);
  client->wait_future(tinker_client::request_id_of(first), true);
  // Another body under the same key, or the same seq_id with another body: 409.
  auto other = proto_body(fb(model, 1, {4, 5}));
  auto r = client->post("forward_backward", other, "application/x-protobuf", key);
  EXPECT_EQ(r.status, 409);
  EXPECT_FALSE(error_of(r).empty());
  r = client->post("forward_backward", other, "application/x-protobuf");
  EXPECT_EQ(r.status, 409);
  EXPECT_FALSE(error_of(r).empty());
  // The model ran seq 1 exactly once.
  EXPECT_EQ(backend.calls(), (std::vector<std::string>{"create:" + model, "fb:" + model + ":1"}));
}

TEST_F(ServerFutures, LongPollReturnsWhenTheResultLandsAndTryAgainAfterTheHold) {
  opts.long_poll_hold = 300ms;
  start();
  auto model = make_model();
  backend.hold();
  auto id = client->submit_forward_backward(fb(model, 1));
  ASSERT_TRUE(backend.wait_entered(2));
  auto r = client->post("retrieve_future", json{{"request_id", id}}.dump(), "application/json",
                        {{"Accept", "application/x-protobuf"}});
  ASSERT_EQ(r.status, 200);
  auto j = parse(r);
  EXPECT_EQ(j.at("type"), "try_again");
  EXPECT_EQ(j.at("request_id"), id);
  EXPECT_EQ(j.at("queue_state"), "active");
  // A poll in flight returns the result once the backend finishes.
  auto poll = std::async(std::launch::async, [&] {
    tinker_client c("127.0.0.1", server->port(), test_key);
    return c.post("retrieve_future", json{{"request_id", id}}.dump(), "application/json",
                  {{"Accept", "application/x-protobuf"}});
  });
  std::this_thread::sleep_for(50ms);
  backend.release();
  auto done = poll.get();
  ASSERT_EQ(done.status, 200);
  // Either the poll saw the result land, or it re-polled after a try_again: both end in proto.
  if (done.content_type == "application/x-protobuf")
    EXPECT_EQ(decode_forward_backward_output_proto(done.body).metrics.at("loss:sum"), 1.0);
  else
    EXPECT_EQ(client->wait_future(id, true).content_type, "application/x-protobuf");
}

TEST_F(ServerFutures, MetadataOnlyPollReportsThePayloadSize) {
  start();
  auto model = make_model();
  auto id = client->submit_forward_backward(fb(model, 1, {1, 2, 3, 4, 5}));
  auto full = client->wait_future(id, true);
  auto r = client->post("retrieve_future",
                        json{{"request_id", id}, {"allow_metadata_only", true}}.dump(),
                        "application/json", {{"Accept", "application/x-protobuf"}});
  ASSERT_EQ(r.status, 200);
  auto j = parse(r);
  EXPECT_EQ(j.at("status"), "complete_metadata");
  EXPECT_EQ(j.at("response_payload_size"), full.body.size());
  // The JSON rendering has its own size.
  auto json_full = client->wait_future(id, false);
  r = client->post("retrieve_future",
                   json{{"request_id", id}, {"allow_metadata_only", true}}.dump());
  EXPECT_EQ(parse(r).at("response_payload_size"), json_full.body.size());
}

TEST_F(ServerFutures, SamplingUnderLoadAnswers429) {
  opts.scheduler.workers = 1;
  opts.scheduler.max_pending_samples = 2; // running requests count until they complete
  start();
  auto session = client->create_session();
  auto sampler = client->create_sampling_session(session, 0, "", "test-base");
  backend.hold();
  auto send = [&](int seq) {
    return client->post("asample", tinker_client::sample_body(sampler, seq, {1}, 1, 1),
                        "application/json", {{"X-Tinker-Sampling-Backpressure", "1"}});
  };
  auto a = send(0);
  ASSERT_EQ(a.status, 200);
  ASSERT_TRUE(backend.wait_entered(1)); // running (held), still pending
  auto b = send(1);
  ASSERT_EQ(b.status, 200); // queued
  auto c = send(2);
  EXPECT_EQ(c.status, 429);
  EXPECT_NE(error_of(c).find("sampling queue full"), std::string::npos);
  EXPECT_EQ(c.headers.at("Retry-After"), "1");
  backend.release();
  client->wait_future(tinker_client::request_id_of(a), true);
  client->wait_future(tinker_client::request_id_of(b), true);
  // The SDK resubmits the same seq_id after a 429: now it is accepted and runs.
  auto again = send(2);
  ASSERT_EQ(again.status, 200);
  EXPECT_EQ(client->wait_future(tinker_client::request_id_of(again), true).content_type,
            "application/x-protobuf");
}

TEST_F(ServerFutures, MissingSeqIdFailsTheWaitersAfterTheGapTimeout) {
  opts.scheduler.gap_timeout = 100ms;
  start();
  auto model = make_model();
  auto id = client->submit_forward_backward(fb(model, 2));
  auto j = parse(client->wait_future(id, true));
  EXPECT_EQ(j.at("category"), "user");
  EXPECT_NE(j.at("error").get<std::string>().find("missing seq_id 1"), std::string::npos);
  // The model moves on.
  EXPECT_EQ(client->forward_backward(fb(model, 3)).metrics.at("loss:sum"), 3.0);
  auto late = client->post("forward_backward", proto_body(fb(model, 1)), "application/x-protobuf");
  EXPECT_EQ(late.status, 400);
  EXPECT_NE(error_of(late).find("already passed"), std::string::npos);
}

TEST_F(ServerFutures, ResultsSurviveARestartOnTheSameDatabase) {
  start();
  auto model = make_model();
  auto id = client->submit_forward_backward(fb(model, 1));
  auto before = client->wait_future(id, true);
  server.reset();
  store.reset();
  start(); // a new server process on the same file
  auto after = client->wait_future(id, true);
  EXPECT_EQ(after.body, before.body);
  EXPECT_EQ(after.content_type, "application/x-protobuf");
  // The model's weights lived in the old process (the shared test backend forgets them as a new
  // process would): training calls say so.
  backend.delete_model(model);
  auto r = client->post("forward_backward", proto_body(fb(model, 2)), "application/x-protobuf");
  EXPECT_EQ(r.status, 404);
  EXPECT_NE(error_of(r).find("restart"), std::string::npos);
}

TEST_F(ServerFutures, PendingAtCrashIsReportedFailed) {
  start();
  auto model = make_model();
  backend.hold();
  auto id = client->submit_forward_backward(fb(model, 1));
  ASSERT_TRUE(backend.wait_entered(2));
  // A crash leaves the future pending in the file; the next process opens the same file.
  test_backend backend2;
  auto store2 = future_store::open(db_path());
  EXPECT_EQ(store2->failed_at_open(), 1u);
  auto o2 = opts;
  o2.checkpoint_dir = (dir.path() / "checkpoints2").string();
  http_server server2(o2, backend2, *store2);
  tinker_client client2("127.0.0.1", server2.start(), test_key);
  auto j = parse(client2.wait_future(id, true));
  EXPECT_EQ(j.at("category"), "server");
  EXPECT_EQ(j.at("error"), restart_failure_message);
  backend.release();
}

} // namespace
} // namespace rlforge::service::test
