#include "placement/table.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "tests/placement/helpers.hpp"

using namespace rlforge::placement;
using namespace rlforge::placement::test_support;

namespace {

template <class T> const T& pick(std::mt19937& rng, const std::vector<T>& xs) {
  return xs[std::uniform_int_distribution<std::size_t>(0, xs.size() - 1)(rng)];
}

node_spec random_node(std::mt19937& rng, const std::string& id) {
  node_spec n;
  n.id = id;
  auto gpus = std::uniform_int_distribution<int>(0, 8)(rng);
  if (std::uniform_int_distribution<int>(0, 3)(rng) == 0) {
    // A node with sliced devices (partial capacity).
    for (int d = 0; d < gpus; ++d)
      n.gpu_devices.push_back(pick(rng, std::vector<units>{2500, 5000, 10000}));
  } else {
    n.gpu_devices.assign(static_cast<std::size_t>(gpus), units_per_whole);
  }
  EXPECT_TRUE(n.resources.set("CPU", pick(rng, std::vector<double>{2, 8, 16, 64})).ok());
  if (std::uniform_int_distribution<int>(0, 2)(rng) == 0) {
    EXPECT_TRUE(n.resources.set("ssd", 2).ok());
  }
  return n;
}

placement_request random_request(std::mt19937& rng) {
  placement_request r;
  r.strategy = pick(rng, std::vector<placement_strategy>{
                             placement_strategy::pack, placement_strategy::spread,
                             placement_strategy::strict_pack, placement_strategy::strict_spread});
  auto n = std::uniform_int_distribution<int>(1, 4)(rng);
  for (int i = 0; i < n; ++i) {
    resource_set b;
    auto gpu = pick(rng, std::vector<double>{0, 0.1, 0.2, 0.25, 0.5, 0.7, 1, 1, 2, 3});
    auto cpu = pick(rng, std::vector<double>{0, 0.5, 1, 2, 4});
    if (gpu > 0) {
      EXPECT_TRUE(b.set("GPU", gpu).ok());
    }
    if (cpu > 0 || gpu == 0) {
      EXPECT_TRUE(b.set("CPU", cpu > 0 ? cpu : 1).ok());
    }
    if (std::uniform_int_distribution<int>(0, 9)(rng) == 0) {
      EXPECT_TRUE(b.set("ssd", 1).ok());
    }
    r.bundles.push_back(b);
  }
  return r;
}

/// Recomputes, from the reservations alone, what every node and device must have free, and
/// compares with what the cluster reports. Also checks strategy and ordering guarantees of
/// every placed group and that no pending group could be placed now.
void check_invariants(placement_table& t, const std::set<std::string>& expected_groups) {
  const auto& cluster = t.cluster();
  std::map<std::string, std::map<std::string, units>> held; // node -> resource -> sum
  std::map<std::pair<std::string, int>, units> device_held; // (node, device) -> sum
  for (const auto& [group, bundles] : cluster.groups()) {
    auto request = t.request(group);
    ASSERT_TRUE(request.ok()) << group;
    ASSERT_EQ(bundles.size(), request->bundles.size()) << group;
    std::set<std::string> nodes;
    for (const auto& b : bundles) {
      nodes.insert(b.node_id);
      for (const auto& [name, amount] : b.resources)
        held[b.node_id][name] += amount;
      auto gpu = b.resources.get("GPU");
      auto per = b.device_ids.empty() ? 0 : gpu / static_cast<units>(b.device_ids.size());
      EXPECT_EQ(per * static_cast<units>(b.device_ids.size()), gpu) << group;
      for (auto d : b.device_ids)
        device_held[{b.node_id, d}] += per;
      EXPECT_EQ(b.resources, request->bundles[b.request_index]) << group;
    }
    if (request->strategy == placement_strategy::strict_pack) {
      EXPECT_EQ(nodes.size(), 1u) << group;
    }
    if (request->strategy == placement_strategy::strict_spread) {
      EXPECT_EQ(nodes.size(), bundles.size()) << group;
    }
    for (std::size_t i = 1; i < bundles.size(); ++i) {
      auto key = [&](const placed_bundle& b) {
        return std::make_tuple(*cluster.node_index(b.node_id),
                               b.device_ids.empty() ? INT_MAX : b.device_ids.front(),
                               b.request_index);
      };
      EXPECT_LT(key(bundles[i - 1]), key(bundles[i])) << group;
    }
  }
  for (const auto& entry : cluster.entries()) {
    const auto& columns = cluster.columns();
    units device_free_sum = 0;
    for (std::size_t d = 0; d < entry.total.devices.size(); ++d) {
      auto cap = entry.total.devices[d];
      auto free = entry.free.devices[d];
      ASSERT_GE(free, 0) << entry.id << " device " << d;
      ASSERT_LE(free, cap) << entry.id << " device " << d;
      auto it = device_held.find({entry.id, static_cast<int>(d)});
      EXPECT_EQ(cap - free, it == device_held.end() ? 0 : it->second)
          << entry.id << " device " << d;
      device_free_sum += free;
    }
    EXPECT_EQ(entry.free.columns[0], device_free_sum) << entry.id;
    for (std::size_t c = 0; c < columns.size(); ++c) {
      ASSERT_GE(entry.free.columns[c], 0) << entry.id << " " << columns[c];
      ASSERT_LE(entry.free.columns[c], entry.total.columns[c]) << entry.id << " " << columns[c];
      auto node_it = held.find(entry.id);
      units sum = 0;
      if (node_it != held.end())
        if (auto it = node_it->second.find(columns[c]); it != node_it->second.end())
          sum = it->second;
      EXPECT_EQ(entry.total.columns[c] - entry.free.columns[c], sum)
          << entry.id << " " << columns[c];
    }
  }
  // The table knows exactly the groups the operations left, each in one state.
  std::set<std::string> known;
  for (const auto& id : cluster.group_ids()) {
    EXPECT_EQ(t.state(id), group_state::placed) << id;
    known.insert(id);
  }
  for (const auto& id : t.pending()) {
    EXPECT_EQ(t.state(id), group_state::pending) << id;
    EXPECT_TRUE(known.insert(id).second) << id << " is both placed and pending";
    // Retries happen whenever resources free up, so nothing pending fits now.
    EXPECT_FALSE(detail::schedule_quiet(cluster, t.request(id).value()).placed()) << id;
  }
  EXPECT_EQ(known, expected_groups);
}

} // namespace

TEST(PlacementRandom, RandomOperationsNeverOverAllocateAndKeepExactBookkeeping) {
  std::mt19937 rng(20240611);
  int placed = 0;
  int pending = 0;
  int infeasible = 0;
  int evictions = 0;
  for (int round = 0; round < 6; ++round) {
    placement_table t;
    int next_node = 0;
    auto nodes = std::uniform_int_distribution<int>(1, 6)(rng);
    for (int i = 0; i < nodes; ++i)
      ASSERT_TRUE(t.add_node(random_node(rng, "n" + std::to_string(next_node++))).ok());
    std::set<std::string> groups;
    int next_group = 0;
    for (int op = 0; op < 700; ++op) {
      auto dice = std::uniform_int_distribution<int>(0, 99)(rng);
      std::vector<std::string> all(groups.begin(), groups.end());
      if (dice < 55 || all.empty()) {
        auto id = "g" + std::to_string(next_group++);
        auto r = t.create(id, random_request(rng));
        ASSERT_FALSE(r.invalid()) << r.reason;
        if (r.placed() || r.pending())
          groups.insert(id);
        placed += r.placed() ? 1 : 0;
        pending += r.pending() ? 1 : 0;
        infeasible += r.infeasible() ? 1 : 0;
      } else if (dice < 88) {
        auto id = pick(rng, all);
        ASSERT_TRUE(t.remove(id).ok()) << id;
        groups.erase(id);
      } else if (dice < 93) {
        if (!t.pending().empty()) {
          auto id = pick(rng, t.pending());
          ASSERT_TRUE(t.cancel_pending(id).ok()) << id;
          groups.erase(id);
        }
      } else if (dice < 97 || t.cluster().node_count() <= 1) {
        ASSERT_TRUE(t.add_node(random_node(rng, "n" + std::to_string(next_node++))).ok());
      } else {
        auto victim = pick(rng, t.cluster().nodes()).id;
        auto removal = t.remove_node(victim);
        ASSERT_TRUE(removal.ok());
        evictions += static_cast<int>(removal->evicted.size());
      }
      check_invariants(t, groups);
      if (HasFatalFailure() || HasNonfatalFailure())
        FAIL() << "invariant broken after op " << op << " of round " << round << "\n"
               << t.describe();
    }
  }
  // The random mix exercised every outcome.
  EXPECT_GT(placed, 100);
  EXPECT_GT(pending, 20);
  EXPECT_GT(infeasible, 5);
  EXPECT_GT(evictions, 0);
}
