// actors/head_metrics.hpp: the head's Prometheus text from a cluster status document.
#include "actors/head_metrics.hpp"

#include <gtest/gtest.h>

#include "tests/runtime/prometheus_parse.hpp"

namespace rlforge::actors {
namespace {

TEST(HeadMetrics, GaugesComeFromTheStatusAndCountersFromEvents) {
  auto status = nlohmann::json::parse(R"json({
    "nodes": [
      {"id": "a", "alive": true, "last_heartbeat_ms": 250, "ranks": 3},
      {"id": "b", "alive": false, "last_heartbeat_ms": 9000, "ranks": 0, "death": "killed"},
      {"id": "c", "alive": true, "last_heartbeat_ms": 1500, "ranks": 0}],
    "placement_groups": [{"name": "p", "state": "placed"}, {"name": "q", "state": "placed"},
                         {"name": "r", "state": "failed"}],
    "actor_groups": [{"name": "g", "state": "alive"},
                     {"name": "h", "state": "failed: node 'b' died (killed)"}],
    "drivers": [{"id": "d1"}]})json");
  runtime::metrics_registry r;
  count_heartbeat(r);
  count_heartbeat(r);
  count_node_death(r);
  observe_spawn(r, 0.03);
  observe_spawn(r, 2.0);
  auto p = rlforge::test::parse_prometheus(head_metrics_text(status, r));
  ASSERT_TRUE(p.error.empty()) << p.error;
  EXPECT_EQ(p.value("rlforge_cluster_nodes{state=\"alive\"}"), 2);
  EXPECT_EQ(p.value("rlforge_cluster_nodes{state=\"dead\"}"), 1);
  EXPECT_EQ(p.value("rlforge_node_heartbeat_age_seconds{node=\"a\"}"), 0.25);
  EXPECT_EQ(p.value("rlforge_node_heartbeat_age_seconds{node=\"c\"}"), 1.5);
  EXPECT_EQ(p.value("rlforge_node_heartbeat_age_seconds{node=\"b\"}"), -1);
  EXPECT_EQ(p.value("rlforge_node_ranks{node=\"a\"}"), 3);
  EXPECT_EQ(p.value("rlforge_placement_groups{state=\"placed\"}"), 2);
  EXPECT_EQ(p.value("rlforge_placement_groups{state=\"failed\"}"), 1);
  EXPECT_EQ(p.value("rlforge_actor_groups{state=\"alive\"}"), 1);
  EXPECT_EQ(p.value("rlforge_actor_groups{state=\"failed\"}"), 1);
  EXPECT_EQ(p.value("rlforge_cluster_drivers"), 1);
  EXPECT_EQ(p.value("rlforge_node_heartbeats_total"), 2);
  EXPECT_EQ(p.value("rlforge_node_deaths_total"), 1);
  EXPECT_EQ(p.value("rlforge_actor_group_spawn_seconds_count"), 2);
  EXPECT_EQ(p.value("rlforge_actor_group_spawn_seconds_bucket{le=\"0.05\"}"), 1);
  // A node that goes away leaves no stale series behind.
  status["nodes"].erase(2);
  auto q = rlforge::test::parse_prometheus(head_metrics_text(status, r));
  EXPECT_EQ(q.value("rlforge_node_heartbeat_age_seconds{node=\"c\"}"), -1);
  EXPECT_EQ(q.value("rlforge_cluster_nodes{state=\"alive\"}"), 1);
}

// Before any event the counters read 0 and an empty status gives zeros, not a failure.
TEST(HeadMetrics, AnEmptyClusterRendersZeros) {
  runtime::metrics_registry r;
  auto p = rlforge::test::parse_prometheus(head_metrics_text(nlohmann::json::object(), r));
  ASSERT_TRUE(p.error.empty()) << p.error;
  EXPECT_EQ(p.value("rlforge_cluster_nodes{state=\"alive\"}"), 0);
  EXPECT_EQ(p.value("rlforge_node_heartbeats_total"), 0);
  EXPECT_EQ(p.value("rlforge_node_deaths_total"), 0);
}

} // namespace
} // namespace rlforge::actors
