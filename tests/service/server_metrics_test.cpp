// GET /metrics on the Tinker service: Prometheus text that parses, counting what was done.
#include <atomic>
#include <thread>
#include <vector>

#include "tests/runtime/prometheus_parse.hpp"
#include "tests/service/server_test_support.hpp"

namespace rlforge::service::test {
namespace {

class ServerMetrics : public server_test {
protected:
  /// GET /metrics with `headers`.
  client_response metrics(const std::map<std::string, std::string>& headers) {
    return client->get_url("http://127.0.0.1:" + std::to_string(server->port()) + "/metrics",
                           headers);
  }
  rlforge::test::prometheus_scrape scrape() {
    auto r = metrics({{"Authorization", std::string("Bearer ") + test_key}});
    EXPECT_EQ(r.status, 200) << r.body;
    auto p = rlforge::test::parse_prometheus(r.body);
    EXPECT_TRUE(p.error.empty()) << p.error << "\n" << r.body;
    return p;
  }
};

TEST_F(ServerMetrics, CountsRequestsTokensFuturesEnginesAndSyncs) {
  start();
  auto model = make_model();
  auto session = model.substr(0, model.find(':'));
  client->forward_backward(fb(model, 1, {1, 2, 3}));
  client->forward_backward(fb(model, 2, {4, 5}));
  auto fwd = fb(model, 3, {6, 7, 8, 9});
  fwd.forward_only = true;
  client->forward_backward(fwd);
  auto base = client->create_sampling_session(session, 0, "", "test-base");
  client->sample(base, 0, {7, 8, 9}, 2, 3);
  client->save_weights_for_sampler(model, 4, "s1");
  backend.fail_next(tinker::error_category::user, "datum 0: refused by the test backend");
  client->wait_future(client->submit_forward_backward(fb(model, 5)), true);
  // Refused requests: unknown endpoint, wrong key.
  EXPECT_EQ(client->get("no_such_endpoint").status, 404);
  tinker_client wrong("127.0.0.1", server->port(), "test-key-124");
  EXPECT_EQ(wrong.get("get_server_capabilities").status, 401);

  auto r = metrics({{"Authorization", std::string("Bearer ") + test_key}});
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type, "text/plain; version=0.0.4; charset=utf-8");
  auto p = rlforge::test::parse_prometheus(r.body);
  ASSERT_TRUE(p.error.empty()) << p.error << "\n" << r.body;
  EXPECT_EQ(p.types.at("rlforge_http_requests_total"), "counter");
  EXPECT_EQ(p.types.at("rlforge_future_latency_seconds"), "histogram");
  EXPECT_EQ(p.value("rlforge_tokens_total{kind=\"trained\"}"), 3 + 2);
  EXPECT_EQ(p.value("rlforge_tokens_total{kind=\"scored\"}"), 4);
  EXPECT_EQ(p.value("rlforge_tokens_total{kind=\"generated\"}"), 2 * 3);
  // Four submissions (the forward-only one and the one the backend refuses included).
  EXPECT_EQ(p.value("rlforge_http_requests_total{endpoint=\"forward_backward\",status=\"200\"}"),
            4);
  EXPECT_EQ(p.value("rlforge_http_requests_total{endpoint=\"forward\",status=\"200\"}"), -1);
  EXPECT_EQ(p.value("rlforge_http_requests_total{endpoint=\"unknown\",status=\"404\"}"), 1);
  EXPECT_EQ(p.value("rlforge_http_requests_total{endpoint=\"unauthenticated\",status=\"401\"}"),
            1);
  EXPECT_EQ(p.value("rlforge_future_latency_seconds_count{type=\"forward_backward\"}"), 3);
  EXPECT_EQ(p.value("rlforge_future_latency_seconds_count{type=\"forward\"}"), 1);
  EXPECT_EQ(p.value("rlforge_future_latency_seconds_count{type=\"sample\"}"), 1);
  EXPECT_EQ(p.value("rlforge_futures_total{outcome=\"ok\",type=\"forward_backward\"}"), 2);
  EXPECT_EQ(p.value("rlforge_futures_total{outcome=\"user\",type=\"forward_backward\"}"), 1);
  EXPECT_EQ(p.value("rlforge_engine_kv_blocks{engine=\"base\"}"), 64);
  EXPECT_EQ(p.value("rlforge_engine_kv_blocks_in_use{engine=\"base\"}"), 3);
  EXPECT_EQ(p.value("rlforge_weight_syncs_total"), 0); // a named sampler save is an export
  EXPECT_EQ(p.value("rlforge_pending_samples"), 0);
  // An ephemeral sampler is a snapshot: a sync.
  client->post("save_weights_for_sampler",
               json{{"model_id", model}, {"seq_id", 6}, {"sampling_session_seq_id", 1}}.dump());
  client->optim_step(model, 7, tinker::adam_params{});
  auto after = scrape();
  EXPECT_EQ(after.value("rlforge_weight_syncs_total"), 1);
  EXPECT_EQ(after.value("rlforge_weight_sync_bytes_total"), 1000);
  EXPECT_EQ(after.value("rlforge_weight_sync_seconds_total"), 0.25);
}

TEST_F(ServerMetrics, NeedsTheApiKeyAsBearerOrHeader) {
  start();
  EXPECT_EQ(metrics({}).status, 401);
  EXPECT_EQ(metrics({{"Authorization", "Bearer test-key-124"}}).status, 401);
  EXPECT_EQ(metrics({{"Authorization", "Basic dGVzdA=="}}).status, 401);
  EXPECT_EQ(metrics({{"X-API-Key", test_key}}).status, 200);
  EXPECT_EQ(metrics({{"Authorization", std::string("Bearer ") + test_key}}).status, 200);
  EXPECT_TRUE(backend.calls().empty());
}

// Queue depth per lane: a held training call keeps the model's later requests queued.
TEST_F(ServerMetrics, ReportsTheQueueDepthPerLane) {
  start();
  auto model = make_model();
  backend.hold();
  auto first = client->submit_forward_backward(fb(model, 1));
  ASSERT_TRUE(backend.wait_entered(2)); // create, then fb 1 held
  auto second = client->submit_forward_backward(fb(model, 2));
  auto third = client->submit_forward_backward(fb(model, 3));
  // The scheduler may have taken 2 and 3 along with 1 only if they were there before it ran:
  // they were not, so both wait.
  auto p = scrape();
  EXPECT_EQ(p.types.at("rlforge_queue_depth"), "gauge");
  EXPECT_EQ(p.value("rlforge_queue_depth{kind=\"training\",lane=\"" + model + "\"}"), 2);
  backend.release();
  client->wait_future(third, true);
  client->wait_future(second, true);
  client->wait_future(first, true);
  EXPECT_EQ(scrape().value("rlforge_queue_depth{kind=\"training\",lane=\"" + model + "\"}"), -1);
}

// Scrapes while clients sample from several threads: every scrape parses, and the final counts
// equal the work done.
TEST_F(ServerMetrics, ScrapesConcurrentWithTrafficCountEverything) {
  start();
  auto model = make_model();
  auto session = model.substr(0, model.find(':'));
  std::vector<std::string> samplers;
  for (int t = 0; t < 4; ++t)
    samplers.push_back(client->create_sampling_session(session, t, "", "test-base"));
  std::atomic<bool> done{false};
  std::atomic<int> bad_scrapes{0};
  std::thread scraper([&] {
    while (!done) {
      auto r = metrics({{"X-API-Key", test_key}});
      if (r.status != 200 || !rlforge::test::parse_prometheus(r.body).error.empty())
        ++bad_scrapes;
    }
  });
  std::vector<std::thread> clients;
  for (int t = 0; t < 4; ++t)
    clients.emplace_back([&, t] {
      for (int i = 0; i < 5; ++i)
        client->sample(samplers[t], i, {static_cast<int64_t>(10 + t)}, 2, 4);
    });
  for (auto& c : clients)
    c.join();
  done = true;
  scraper.join();
  EXPECT_EQ(bad_scrapes, 0);
  auto p = scrape();
  EXPECT_EQ(p.value("rlforge_tokens_total{kind=\"generated\"}"), 4 * 5 * 2 * 4);
  EXPECT_EQ(p.value("rlforge_future_latency_seconds_count{type=\"sample\"}"), 4 * 5);
  EXPECT_EQ(p.value("rlforge_http_requests_total{endpoint=\"asample\",status=\"200\"}"), 4 * 5);
}

} // namespace
} // namespace rlforge::service::test
