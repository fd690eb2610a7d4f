#include "placement/scheduler.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <map>

#include "tests/placement/helpers.hpp"

using namespace rlforge::placement;
using namespace rlforge::placement::test_support;

namespace {

struct strategy_case {
  const char* name;
  std::vector<int> node_gpus; ///< one node per entry, 64 CPUs each
  placement_strategy strategy;
  std::vector<double> bundle_gpus; ///< bundle i is {GPU: g, CPU: 1} ({CPU: 1} when g is 0)
  schedule_kind expected;
  std::size_t expected_nodes; ///< distinct nodes used when placed
};

cluster_state cluster_for(const strategy_case& c) {
  std::vector<node_spec> nodes;
  for (std::size_t i = 0; i < c.node_gpus.size(); ++i)
    nodes.push_back(gpu_node("n" + std::to_string(i), c.node_gpus[i], 64));
  return cluster_of(nodes);
}

placement_request request_for(const strategy_case& c) {
  std::vector<resource_set> bundles;
  for (auto g : c.bundle_gpus)
    bundles.push_back(g > 0 ? res({{"GPU", g}, {"CPU", 1}}) : res({{"CPU", 1}}));
  return req(c.strategy, bundles);
}

/// Checks what every placed result must satisfy, independently of the strategy: every request
/// index exactly once, device counts matching GPU amounts, no device or node over-committed,
/// and the (node, first device, index) order.
void expect_consistent(const cluster_state& cluster, const placement_request& request,
                       const schedule_result& r) {
  ASSERT_EQ(r.bundles.size(), request.bundles.size());
  std::vector<int> seen(request.bundles.size(), 0);
  std::map<std::pair<std::string, int>, units> device_use;
  std::map<std::string, units> cpu_use;
  for (const auto& b : r.bundles) {
    ASSERT_LT(b.request_index, request.bundles.size());
    ++seen[b.request_index];
    EXPECT_EQ(b.resources, request.bundles[b.request_index]);
    auto gpu = b.resources.get("GPU");
    auto want = gpu == 0 ? 0u : gpu < units_per_whole ? 1u : static_cast<unsigned>(gpu / 10000);
    EXPECT_EQ(b.device_ids.size(), want);
    for (auto d : b.device_ids)
      device_use[{b.node_id, d}] += gpu >= units_per_whole ? units_per_whole : gpu;
    cpu_use[b.node_id] += b.resources.get("CPU");
  }
  for (auto count : seen)
    EXPECT_EQ(count, 1);
  for (const auto& [key, used] : device_use) {
    auto status = cluster.node(key.first);
    ASSERT_TRUE(status.ok());
    ASSERT_LT(static_cast<std::size_t>(key.second), status->device_free.size());
    EXPECT_LE(used, status->device_free[static_cast<std::size_t>(key.second)])
        << key.first << " device " << key.second;
  }
  for (const auto& [node, used] : cpu_use)
    EXPECT_LE(used, cluster.node(node)->available.get("CPU")) << node;
  auto key = [&](const placed_bundle& b) {
    return std::make_tuple(*cluster.node_index(b.node_id),
                           b.device_ids.empty() ? INT_MAX : b.device_ids.front(), b.request_index);
  };
  for (std::size_t i = 1; i < r.bundles.size(); ++i)
    EXPECT_LT(key(r.bundles[i - 1]), key(r.bundles[i])) << "bundle order at rank " << i;
}

class StrategySemantics : public ::testing::TestWithParam<strategy_case> {};

} // namespace

TEST_P(StrategySemantics, PlacesAsTheStrategyRequires) {
  const auto& c = GetParam();
  auto cluster = cluster_for(c);
  auto request = request_for(c);
  auto r = schedule(cluster, request);
  ASSERT_EQ(r.kind, c.expected) << to_string(r.kind) << ": " << r.reason;
  if (c.expected != schedule_kind::placed) {
    EXPECT_FALSE(r.reason.empty());
    EXPECT_TRUE(r.bundles.empty());
    return;
  }
  EXPECT_TRUE(r.reason.empty());
  expect_consistent(cluster, request, r);
  EXPECT_EQ(distinct_nodes(r.bundles), c.expected_nodes);
}

INSTANTIATE_TEST_SUITE_P(Scheduler, StrategySemantics,
                         ::testing::Values(strategy_case{"PackFitsOnOneNode",
                                                         {4, 4},
                                                         placement_strategy::pack,
                                                         {1, 1, 1, 1},
                                                         schedule_kind::placed,
                                                         1},
                                           strategy_case{"PackSpillsOntoASecondNode",
                                                         {4, 4},
                                                         placement_strategy::pack,
                                                         {1, 1, 1, 1, 1, 1},
                                                         schedule_kind::placed,
                                                         2},
                                           strategy_case{"PackUsesAsFewNodesAsPossible",
                                                         {4, 4, 4},
                                                         placement_strategy::pack,
                                                         {1, 1, 1, 1, 1, 1},
                                                         schedule_kind::placed,
                                                         2},
                                           strategy_case{"PackBeyondTheWholeClusterIsInfeasible",
                                                         {4, 4},
                                                         placement_strategy::pack,
                                                         {1, 1, 1, 1, 1, 1, 1, 1, 1},
                                                         schedule_kind::infeasible,
                                                         0},
                                           strategy_case{"PackBundleLargerThanAnyNodeIsInfeasible",
                                                         {2, 2},
                                                         placement_strategy::pack,
                                                         {4},
                                                         schedule_kind::infeasible,
                                                         0},
                                           strategy_case{"PackFractionsShareOneDevice",
                                                         {1, 1},
                                                         placement_strategy::pack,
                                                         {0.2, 0.2, 0.2, 0.2, 0.2},
                                                         schedule_kind::placed,
                                                         1},
                                           strategy_case{"SpreadUsesDistinctNodes",
                                                         {2, 2, 2, 2},
                                                         placement_strategy::spread,
                                                         {1, 1, 1, 1},
                                                         schedule_kind::placed,
                                                         4},
                                           strategy_case{"SpreadReusesNodesWhenTooFew",
                                                         {4, 4},
                                                         placement_strategy::spread,
                                                         {1, 1, 1, 1},
                                                         schedule_kind::placed,
                                                         2},
                                           strategy_case{"SpreadOnOneNodeStillPlaces",
                                                         {8},
                                                         placement_strategy::spread,
                                                         {1, 1, 1},
                                                         schedule_kind::placed,
                                                         1},
                                           strategy_case{"SpreadFractions",
                                                         {1, 1},
                                                         placement_strategy::spread,
                                                         {0.5, 0.5, 0.5, 0.5},
                                                         schedule_kind::placed,
                                                         2},
                                           strategy_case{"SpreadCpuOnlyBundles",
                                                         {0, 0, 0},
                                                         placement_strategy::spread,
                                                         {0, 0, 0},
                                                         schedule_kind::placed,
                                                         3},
                                           strategy_case{"StrictPackOnOneNode",
                                                         {8, 8},
                                                         placement_strategy::strict_pack,
                                                         {1, 1, 1, 1, 1, 1, 1, 1},
                                                         schedule_kind::placed,
                                                         1},
                                           strategy_case{"StrictPackLargerThanAnyNodeIsInfeasible",
                                                         {4, 4},
                                                         placement_strategy::strict_pack,
                                                         {1, 1, 1, 1, 1},
                                                         schedule_kind::infeasible,
                                                         0},
                                           strategy_case{"StrictPackFractionsFillOneGpu",
                                                         {1},
                                                         placement_strategy::strict_pack,
                                                         {0.5, 0.3, 0.2},
                                                         schedule_kind::placed,
                                                         1},
                                           strategy_case{"StrictSpreadOneNodeEach",
                                                         {1, 1, 1},
                                                         placement_strategy::strict_spread,
                                                         {1, 1, 1},
                                                         schedule_kind::placed,
                                                         3},
                                           strategy_case{
                                               "StrictSpreadMoreBundlesThanNodesIsInfeasible",
                                               {8, 8},
                                               placement_strategy::strict_spread,
                                               {0.1, 0.1, 0.1},
                                               schedule_kind::infeasible,
                                               0},
                                           strategy_case{"StrictSpreadHeterogeneousNodes",
                                                         {1, 2, 4},
                                                         placement_strategy::strict_spread,
                                                         {1, 4, 2},
                                                         schedule_kind::placed,
                                                         3},
                                           strategy_case{"StrictSpreadNoMatchingIsInfeasible",
                                                         {1, 1, 4},
                                                         placement_strategy::strict_spread,
                                                         {2, 2, 1},
                                                         schedule_kind::infeasible,
                                                         0}),
                         [](const ::testing::TestParamInfo<strategy_case>& info) {
                           return std::string(info.param.name);
                         });

TEST(Scheduler, ReportsInfeasibleWhenNoNodeIsLargeEnough) {
  auto cluster = cluster_of({gpu_node("n0", 4), gpu_node("n1", 2)});
  auto r = schedule(cluster, req(placement_strategy::pack,
                                 {res({{"GPU", 1}}), res({{"GPU", 2}}), res({{"GPU", 8}})}));
  ASSERT_TRUE(r.infeasible()) << r.reason;
  EXPECT_EQ(r.reason, "bundle 2 needs GPU: 8 but the largest node has GPU: 4");
}

TEST(Scheduler, ReportsInfeasibleForResourcesNoNodeHas) {
  auto cluster = cluster_of({gpu_node("n0", 4), gpu_node("n1", 0, 8)});
  auto tpu = schedule(cluster, req(placement_strategy::spread, {res({{"TPU", 1}})}));
  ASSERT_TRUE(tpu.infeasible());
  EXPECT_EQ(tpu.reason, "bundle 0 needs TPU: 1 but no node has TPU");
  auto cpu = schedule(cluster, req(placement_strategy::pack, {res({{"CPU", 65}})}));
  ASSERT_TRUE(cpu.infeasible());
  EXPECT_EQ(cpu.reason, "bundle 0 needs CPU: 65 but the largest node has CPU: 64");
  auto together = schedule(
      cluster, req(placement_strategy::pack, {res({{"GPU", 1}}), res({{"GPU", 1}, {"CPU", 64}})}));
  // n0 has GPUs and 64 CPUs, so this one fits; a bundle needing more than one node offers is not.
  EXPECT_TRUE(together.placed()) << together.reason;
  auto split = cluster_of({gpu_node("g", 4, 1), gpu_node("c", 0, 64)});
  auto r = schedule(split, req(placement_strategy::pack, {res({{"GPU", 1}, {"CPU", 8}})}));
  ASSERT_TRUE(r.infeasible());
  EXPECT_EQ(r.reason, "bundle 0 needs GPU: 1, CPU: 8 on one node but no single node has all of it");
}

TEST(Scheduler, ReportsInfeasibleDeviceShapes) {
  cluster_state c;
  ASSERT_TRUE(c.add_node(node_spec{"slices", {}, {3000, 3000, 3000, 3000}}).ok());
  auto frac = schedule(c, req(placement_strategy::pack, {res({{"GPU", 0.5}})}));
  ASSERT_TRUE(frac.infeasible());
  EXPECT_EQ(frac.reason,
            "bundle 0 needs GPU: 0.5 on one device but the largest device has GPU: 0.3");
  auto whole = schedule(c, req(placement_strategy::pack, {res({{"GPU", 1}})}));
  ASSERT_TRUE(whole.infeasible());
  EXPECT_EQ(whole.reason,
            "bundle 0 needs GPU: 1 as 1 whole devices but no node has more than 0 whole devices");
}

TEST(Scheduler, ReportsStrategyLevelInfeasibility) {
  auto two = cluster_of({gpu_node("n0", 8), gpu_node("n1", 8)});
  auto spread = schedule(two, req(placement_strategy::strict_spread, repeat(3, res({{"GPU", 1}}))));
  ASSERT_TRUE(spread.infeasible());
  EXPECT_EQ(spread.reason,
            "strict_spread needs 3 distinct nodes (one per bundle) but the cluster has 2 nodes");
  auto pack = schedule(two, req(placement_strategy::strict_pack, repeat(3, res({{"GPU", 4}}))));
  ASSERT_TRUE(pack.infeasible());
  EXPECT_EQ(pack.reason, "strict_pack needs GPU: 12 on one node (the sum of its 3 bundles) but "
                         "the largest node has GPU: 8");
  auto none = schedule(cluster_state{}, req(placement_strategy::pack, {res({{"CPU", 1}})}));
  ASSERT_TRUE(none.infeasible());
  EXPECT_NE(none.reason.find("no nodes"), std::string::npos) << none.reason;
}

TEST(Scheduler, ReportsPendingNamingWhatIsHeldAndByWhom) {
  auto cluster = cluster_of({gpu_node("n0", 2, 8), gpu_node("n1", 2, 8)});
  auto first = schedule(cluster, req(placement_strategy::pack, repeat(2, res({{"GPU", 1}}))));
  ASSERT_TRUE(first.placed());
  ASSERT_TRUE(cluster.reserve("trainer", first.bundles).ok());
  auto second = schedule(cluster, req(placement_strategy::pack, repeat(2, res({{"GPU", 1}}))));
  ASSERT_TRUE(second.placed());
  ASSERT_TRUE(cluster.reserve("sampler", second.bundles).ok());
  auto r = schedule(cluster, req(placement_strategy::pack, {res({{"GPU", 1}, {"CPU", 1}})}));
  ASSERT_TRUE(r.pending()) << r.reason;
  EXPECT_NE(r.reason.find("bundle 0 (GPU: 1, CPU: 1) does not fit on any node now"),
            std::string::npos)
      << r.reason;
  EXPECT_NE(r.reason.find("node n0 (free GPU: 0, CPU: 8) by trainer (GPU: 2)"), std::string::npos)
      << r.reason;
  EXPECT_NE(r.reason.find("node n1 (free GPU: 0, CPU: 8) by sampler (GPU: 2)"), std::string::npos)
      << r.reason;
}

TEST(Scheduler, IsPureAndDeterministic) {
  auto cluster = cluster_of({gpu_node("n0", 4), gpu_node("n1", 4), gpu_node("n2", 4)});
  ASSERT_TRUE(
      cluster
          .reserve("x",
                   schedule(cluster, req(placement_strategy::pack, {res({{"GPU", 0.5}})})).bundles)
          .ok());
  auto before = cluster.describe();
  auto request = req(placement_strategy::spread, repeat(5, res({{"GPU", 1}, {"CPU", 2}})));
  auto a = schedule(cluster, request);
  auto b = schedule(cluster, request);
  ASSERT_TRUE(a.placed());
  EXPECT_EQ(cluster.describe(), before);
  ASSERT_EQ(a.bundles.size(), b.bundles.size());
  for (std::size_t i = 0; i < a.bundles.size(); ++i) {
    EXPECT_EQ(a.bundles[i].node_id, b.bundles[i].node_id);
    EXPECT_EQ(a.bundles[i].device_ids, b.bundles[i].device_ids);
    EXPECT_EQ(a.bundles[i].request_index, b.bundles[i].request_index);
  }
}

TEST(Scheduler, OrdersBundlesByNodeThenDeviceAndKeepsRequestIndices) {
  auto cluster = cluster_of({gpu_node("a", 4), gpu_node("b", 1)});
  // Device 0 of node a is taken and device 2 half taken.
  ASSERT_TRUE(cluster
                  .reserve("hold", {placed_bundle{0, "a", {0}, res({{"GPU", 1}})},
                                    placed_bundle{1, "a", {2}, res({{"GPU", 0.5}})}})
                  .ok());
  auto request =
      req(placement_strategy::pack, {res({{"GPU", 0.5}}), res({{"GPU", 1}}), res({{"CPU", 1}}),
                                     res({{"GPU", 1}}), res({{"GPU", 1}})});
  auto r = schedule(cluster, request);
  ASSERT_TRUE(r.placed()) << r.reason;
  expect_consistent(cluster, request, r);
  // Pack puts four bundles on a (whole GPUs on devices 1 and 3, the half on device 2, the CPU
  // bundle without a device last) and spills bundle 4 onto b.
  std::vector<std::tuple<std::string, std::vector<int>, std::size_t>> got;
  for (const auto& bundle : r.bundles)
    got.emplace_back(bundle.node_id, bundle.device_ids, bundle.request_index);
  using row = std::tuple<std::string, std::vector<int>, std::size_t>;
  EXPECT_EQ(got, (std::vector<row>{row{"a", {1}, 1}, row{"a", {2}, 0}, row{"a", {3}, 3},
                                   row{"a", {}, 2}, row{"b", {0}, 4}}));
}

TEST(Scheduler, WholeGpuBundlesTakeTheLowestFreeDevices) {
  auto cluster = cluster_of({gpu_node("n0", 8)});
  ASSERT_TRUE(cluster.reserve("hold", {placed_bundle{0, "n0", {1}, res({{"GPU", 0.1}})}}).ok());
  auto r = schedule(cluster, req(placement_strategy::pack, {res({{"GPU", 3}})}));
  ASSERT_TRUE(r.placed());
  EXPECT_EQ(r.bundles[0].device_ids, (std::vector<int>{0, 2, 3}));
}

TEST(Scheduler, FractionalBundlesPreferTheMostUsedDeviceThatFits) {
  auto cluster = cluster_of({gpu_node("n0", 3)});
  ASSERT_TRUE(cluster.reserve("a", {placed_bundle{0, "n0", {0}, res({{"GPU", 0.3}})}}).ok());
  ASSERT_TRUE(cluster.reserve("b", {placed_bundle{0, "n0", {2}, res({{"GPU", 0.6}})}}).ok());
  auto fits_b = schedule(cluster, req(placement_strategy::pack, {res({{"GPU", 0.4}})}));
  ASSERT_TRUE(fits_b.placed());
  EXPECT_EQ(fits_b.bundles[0].device_ids, (std::vector<int>{2})); // free 0.4: the tightest fit
  auto fits_a = schedule(cluster, req(placement_strategy::pack, {res({{"GPU", 0.5}})}));
  ASSERT_TRUE(fits_a.placed());
  EXPECT_EQ(fits_a.bundles[0].device_ids, (std::vector<int>{0})); // free 0.7; device 1 stays whole
}

TEST(Scheduler, StrictSpreadFindsAMatchingWhereGreedyChoiceFails) {
  // Bundle 0 only needs a GPU and would take the first idle node; bundle 1 also needs "ssd",
  // which only that node has. A matching moves bundle 0 to the other node.
  cluster_state c;
  ASSERT_TRUE(c.add_node(node_spec{"with_ssd", res({{"GPU", 1}, {"ssd", 1}}), {}}).ok());
  ASSERT_TRUE(c.add_node(node_spec{"plain", res({{"GPU", 1}}), {}}).ok());
  auto r = schedule(c, req(placement_strategy::strict_spread,
                           {res({{"GPU", 1}}), res({{"GPU", 1}, {"ssd", 1}})}));
  ASSERT_TRUE(r.placed()) << r.reason;
  ASSERT_EQ(r.bundles.size(), 2u);
  EXPECT_EQ(r.bundles[0].node_id, "with_ssd");
  EXPECT_EQ(r.bundles[0].request_index, 1u);
  EXPECT_EQ(r.bundles[1].node_id, "plain");
  EXPECT_EQ(r.bundles[1].request_index, 0u);
}

TEST(Scheduler, PackPrefersTheMostLoadedNodeAndSpreadTheLeastLoaded) {
  auto cluster = cluster_of({gpu_node("n0", 4), gpu_node("n1", 4), gpu_node("n2", 4)});
  ASSERT_TRUE(cluster.reserve("busy", {placed_bundle{0, "n1", {0}, res({{"GPU", 1}})}}).ok());
  auto pack = schedule(cluster, req(placement_strategy::pack, repeat(2, res({{"GPU", 1}}))));
  ASSERT_TRUE(pack.placed());
  EXPECT_EQ(pack.bundles[0].node_id, "n1");
  EXPECT_EQ(pack.bundles[1].node_id, "n1");
  auto strict =
      schedule(cluster, req(placement_strategy::strict_pack, repeat(2, res({{"GPU", 1}}))));
  ASSERT_TRUE(strict.placed());
  EXPECT_EQ(strict.bundles[0].node_id, "n1");
  auto spread = schedule(cluster, req(placement_strategy::spread, repeat(2, res({{"GPU", 1}}))));
  ASSERT_TRUE(spread.placed());
  EXPECT_EQ(spread.bundles[0].node_id, "n0");
  EXPECT_EQ(spread.bundles[1].node_id, "n2");
}

TEST(Scheduler, RejectsMalformedRequestsAsInvalid) {
  auto cluster = cluster_of({gpu_node("n0", 4)});
  auto none = schedule(cluster, req(placement_strategy::pack, {}));
  ASSERT_TRUE(none.invalid());
  EXPECT_EQ(none.error, placement_errc::empty_request);
  auto empty = schedule(cluster, req(placement_strategy::pack, {res({{"GPU", 1}}), {}}));
  ASSERT_TRUE(empty.invalid());
  EXPECT_EQ(empty.error, placement_errc::empty_bundle);
  EXPECT_NE(empty.reason.find("bundle 1"), std::string::npos);
  auto frac = schedule(cluster, req(placement_strategy::pack, {res({{"GPU", 2.5}})}));
  ASSERT_TRUE(frac.invalid());
  EXPECT_EQ(frac.error, placement_errc::invalid_bundle);
  EXPECT_NE(frac.reason.find("GPU: 2.5"), std::string::npos);
  auto strategy = schedule(cluster, req(static_cast<placement_strategy>(42), {res({{"GPU", 1}})}));
  ASSERT_TRUE(strategy.invalid());
  EXPECT_EQ(strategy.error, placement_errc::unknown_strategy);
  EXPECT_NE(strategy.reason.find("42"), std::string::npos);
}
