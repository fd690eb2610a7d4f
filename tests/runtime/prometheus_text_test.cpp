// runtime/prometheus_text.hpp: the registry behind GET /metrics and its exposition text.
#include "runtime/prometheus_text.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <thread>
#include <vector>

#include "tests/runtime/prometheus_parse.hpp"

namespace rlforge::runtime {
namespace {

TEST(PrometheusText, RendersCountersGaugesAndHistogramsThatParse) {
  metrics_registry r;
  r.add("rlforge_requests_total", "Requests.", {{"endpoint", "sample"}, {"status", "200"}});
  r.add("rlforge_requests_total", "Requests.", {{"endpoint", "sample"}, {"status", "200"}}, 2);
  r.add("rlforge_requests_total", "Requests.", {{"endpoint", "x\"y\\z\nw"}, {"status", "400"}});
  r.set("rlforge_queue_depth", "Depth.", {{"lane", "base"}}, 3);
  r.set("rlforge_queue_depth", "Depth.", {{"lane", "base"}}, 5);
  r.set("rlforge_temperature", "A gauge without labels.", {}, 0.1);
  for (double v : {0.0005, 0.002, 0.002, 7.0, 1000.0})
    r.observe("rlforge_latency_seconds", "Latency.", {{"kind", "sample"}}, v,
              latency_buckets_seconds());
  const auto text = r.render();
  auto p = test::parse_prometheus(text);
  ASSERT_TRUE(p.error.empty()) << p.error << "\n" << text;
  EXPECT_EQ(p.types.at("rlforge_requests_total"), "counter");
  EXPECT_EQ(p.types.at("rlforge_queue_depth"), "gauge");
  EXPECT_EQ(p.types.at("rlforge_latency_seconds"), "histogram");
  EXPECT_EQ(p.value("rlforge_requests_total{endpoint=\"sample\",status=\"200\"}"), 3);
  EXPECT_EQ(p.value("rlforge_requests_total{endpoint=\"x\\\"y\\\\z\\nw\",status=\"400\"}"), 1);
  EXPECT_EQ(p.value("rlforge_queue_depth{lane=\"base\"}"), 5);
  EXPECT_EQ(p.value("rlforge_temperature"), 0.1);
  EXPECT_NE(text.find("rlforge_temperature 0.1\n"), std::string::npos) << text;
  EXPECT_EQ(p.value("rlforge_latency_seconds_bucket{kind=\"sample\",le=\"0.001\"}"), 1);
  EXPECT_EQ(p.value("rlforge_latency_seconds_bucket{kind=\"sample\",le=\"0.005\"}"), 3);
  EXPECT_EQ(p.value("rlforge_latency_seconds_bucket{kind=\"sample\",le=\"10\"}"), 4);
  EXPECT_EQ(p.value("rlforge_latency_seconds_bucket{kind=\"sample\",le=\"300\"}"), 4);
  EXPECT_EQ(p.value("rlforge_latency_seconds_bucket{kind=\"sample\",le=\"+Inf\"}"), 5);
  EXPECT_EQ(p.value("rlforge_latency_seconds_count{kind=\"sample\"}"), 5);
  EXPECT_DOUBLE_EQ(p.value("rlforge_latency_seconds_sum{kind=\"sample\"}"), 1007.0045);
  EXPECT_EQ(r.render(), text); // same state, same text
  r.clear_gauge("rlforge_queue_depth");
  auto cleared = test::parse_prometheus(r.render());
  EXPECT_EQ(cleared.value("rlforge_queue_depth{lane=\"base\"}"), -1);
  EXPECT_EQ(cleared.types.at("rlforge_queue_depth"), "gauge");
}

TEST(PrometheusText, RefusesMisuseNamingTheMetric) {
  metrics_registry r;
  auto refused = [](auto fn, const std::string& part) {
    try {
      fn();
      ADD_FAILURE() << "accepted; expected a refusal naming " << part;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  refused([&] { r.add("bad name", "", {}); }, "'bad name'");
  refused([&] { r.add("9lives", "", {}); }, "'9lives'");
  refused([&] { r.add("ok_total", "", {{"__reserved", "x"}}); }, "'__reserved'");
  refused([&] { r.add("ok_total", "", {}, -1); }, "'ok_total'");
  r.set_total("bytes_total", "", {}, 10);
  r.set_total("bytes_total", "", {}, 10);
  refused([&] { r.set_total("bytes_total", "", {}, 9); }, "'bytes_total'");
  r.add("ok_total", "", {});
  refused([&] { r.set("ok_total", "", {}, 1); }, "'ok_total'");
  r.observe("h_seconds", "", {}, 1, {1, 2});
  refused([&] { r.observe("h_seconds", "", {}, 1, {1, 3}); }, "'h_seconds'");
  refused([&] { r.observe("h2_seconds", "", {}, 1, {2, 1}); }, "'h2_seconds'");
  refused([&] { r.observe("h3_seconds", "", {{"le", "1"}}, 1, {1}); }, "'le'");
  // The registry still renders what it had.
  EXPECT_TRUE(test::parse_prometheus(r.render()).error.empty());
}

TEST(PrometheusText, TheParserRefusesMalformedText) {
  EXPECT_FALSE(test::parse_prometheus("x 1\n").error.empty()); // no # TYPE
  EXPECT_FALSE(test::parse_prometheus("# TYPE x gauge\nx{a=\"1} 1\n").error.empty());
  EXPECT_FALSE(test::parse_prometheus("# TYPE x gauge\nx one\n").error.empty());
  EXPECT_FALSE(test::parse_prometheus("# TYPE x counter\nx 1\nx 2\n").error.empty());
  EXPECT_FALSE(test::parse_prometheus("# TYPE h histogram\nh_bucket{le=\"1\"} 2\n"
                                      "h_bucket{le=\"+Inf\"} 1\n")
                   .error.empty());
  EXPECT_TRUE(test::parse_prometheus("# TYPE x gauge\nx{a=\"1\",b=\"2\"} 1.5\n").error.empty());
}

// Writers on several threads at once count every increment.
TEST(PrometheusText, ConcurrentWritersLoseNothing) {
  metrics_registry r;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&r, t] {
      for (int i = 0; i < 1000; ++i) {
        r.add("n_total", "", {{"t", std::to_string(t % 2)}});
        r.observe("d_seconds", "", {}, 0.01, latency_buckets_seconds());
        (void)r.render();
      }
    });
  for (auto& th : threads)
    th.join();
  auto p = test::parse_prometheus(r.render());
  EXPECT_EQ(p.value("n_total{t=\"0\"}") + p.value("n_total{t=\"1\"}"), 4000);
  EXPECT_EQ(p.value("d_seconds_count"), 4000);
}

} // namespace
} // namespace rlforge::runtime
