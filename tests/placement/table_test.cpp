#include "placement/table.hpp"

#include <gtest/gtest.h>

#include "tests/placement/helpers.hpp"

using namespace rlforge::placement;
using namespace rlforge::placement::test_support;

namespace {

using ids = std::vector<std::string>;

placement_table table_of(const std::vector<node_spec>& nodes) {
  placement_table t;
  for (const auto& n : nodes) {
    auto ok = t.add_node(n);
    EXPECT_TRUE(ok.ok()) << (ok.ok() ? "" : ok.error().message);
  }
  return t;
}

placement_request gpus(placement_strategy s, std::size_t n, double gpu) {
  return req(s, repeat(n, res({{"GPU", gpu}})));
}

} // namespace

TEST(Table, CreatePlacesAndReservesAtOnce) {
  auto t = table_of({gpu_node("n0", 4, 16)});
  auto r = t.create("g", req(placement_strategy::pack, repeat(2, res({{"GPU", 1}, {"CPU", 2}}))));
  ASSERT_TRUE(r.placed()) << r.reason;
  EXPECT_EQ(t.state("g"), group_state::placed);
  EXPECT_EQ(t.cluster().node("n0")->available, res({{"GPU", 2}, {"CPU", 12}}));
  auto bundles = t.bundles("g");
  ASSERT_TRUE(bundles.ok());
  ASSERT_EQ(bundles->size(), 2u);
  EXPECT_EQ((*bundles)[0].device_ids, (std::vector<int>{0}));
  EXPECT_EQ((*bundles)[1].device_ids, (std::vector<int>{1}));
  EXPECT_EQ(t.placed(), ids{"g"});
}

TEST(Table, FractionalGroupsFragmentDevicesSoAWholeGpuWaitsUntilOneIsFreed) {
  auto t = table_of({gpu_node("n0", 3)});
  ASSERT_TRUE(t.create("a", gpus(placement_strategy::pack, 1, 0.6)).placed());
  ASSERT_TRUE(t.create("b", gpus(placement_strategy::pack, 1, 0.6)).placed());
  ASSERT_TRUE(t.create("c", gpus(placement_strategy::pack, 1, 0.6)).placed());
  // 1.2 GPU is free in total, 0.4 per device: no whole device is left.
  EXPECT_EQ(t.cluster().node("n0")->available.get("GPU"), 12000);
  auto whole = t.create("whole", gpus(placement_strategy::pack, 1, 1));
  ASSERT_TRUE(whole.pending()) << whole.reason;
  EXPECT_NE(whole.reason.find("by a (GPU: 0.6), b (GPU: 0.6), c (GPU: 0.6)"), std::string::npos)
      << whole.reason;
  auto placed = t.remove("b");
  ASSERT_TRUE(placed.ok());
  EXPECT_EQ(*placed, ids{"whole"});
  EXPECT_EQ(t.bundles("whole")->front().device_ids, (std::vector<int>{1}));
}

TEST(Table, FiveFifthsShareOneGpuAndASixthWaits) {
  auto t = table_of({gpu_node("n0", 1)});
  for (int i = 0; i < 5; ++i) {
    auto r = t.create("g" + std::to_string(i), gpus(placement_strategy::pack, 1, 0.2));
    ASSERT_TRUE(r.placed()) << i << ": " << r.reason;
  }
  EXPECT_EQ(t.cluster().node("n0")->device_free, (std::vector<units>{0}));
  EXPECT_TRUE(t.create("g5", gpus(placement_strategy::pack, 1, 0.2)).pending());
  EXPECT_EQ(t.remove("g0").value(), ids{"g5"});
}

TEST(Table, TenthsAndSevenTenthsAddUpToOneGpuExactly) {
  auto t = table_of({gpu_node("n0", 1)});
  ASSERT_TRUE(t.create("tenths", gpus(placement_strategy::strict_pack, 3, 0.1)).placed());
  ASSERT_TRUE(t.create("rest", gpus(placement_strategy::pack, 1, 0.7)).placed());
  EXPECT_EQ(t.cluster().node("n0")->available.get("GPU"), 0);
  EXPECT_TRUE(t.create("crumb", gpus(placement_strategy::pack, 1, 0.0001)).pending());
}

TEST(Table, InfeasibleGroupsAreNotQueued) {
  auto t = table_of({gpu_node("n0", 2)});
  auto r = t.create("big", gpus(placement_strategy::pack, 1, 4));
  ASSERT_TRUE(r.infeasible());
  EXPECT_EQ(r.reason, "bundle 0 needs GPU: 4 but the largest node has GPU: 2");
  EXPECT_FALSE(t.state("big").has_value());
  EXPECT_TRUE(t.pending().empty());
  // The id is free for another attempt.
  EXPECT_TRUE(t.create("big", gpus(placement_strategy::pack, 1, 2)).placed());
}

TEST(Table, RemovePlacesPendingGroupsInFifoOrder) {
  auto t = table_of({gpu_node("n0", 4)});
  ASSERT_TRUE(t.create("all", gpus(placement_strategy::pack, 4, 1)).placed());
  ASSERT_TRUE(t.create("p1", gpus(placement_strategy::pack, 2, 1)).pending());
  ASSERT_TRUE(t.create("p2", gpus(placement_strategy::pack, 3, 1)).pending());
  ASSERT_TRUE(t.create("p3", gpus(placement_strategy::pack, 2, 1)).pending());
  EXPECT_EQ(t.pending(), (ids{"p1", "p2", "p3"}));
  // Freeing 4 GPUs places p1 (2) first; p2 (3) then does not fit but does not block p3 (2).
  auto placed = t.remove("all");
  ASSERT_TRUE(placed.ok());
  EXPECT_EQ(*placed, (ids{"p1", "p3"}));
  EXPECT_EQ(t.pending(), ids{"p2"});
  EXPECT_EQ(t.remove("p1").value(), ids{});
  EXPECT_EQ(t.remove("p3").value(), ids{"p2"});
  EXPECT_TRUE(t.pending().empty());
}

TEST(Table, NodeJoinPlacesPendingGroups) {
  auto t = table_of({gpu_node("n0", 2)});
  ASSERT_TRUE(t.create("first", gpus(placement_strategy::pack, 2, 1)).placed());
  ASSERT_TRUE(t.create("wide", gpus(placement_strategy::spread, 2, 1)).pending());
  ASSERT_TRUE(t.create("strict", gpus(placement_strategy::strict_spread, 1, 1)).pending());
  auto joined = t.add_node(gpu_node("n1", 2));
  ASSERT_TRUE(joined.ok());
  EXPECT_EQ(*joined, (ids{"wide"}));
  EXPECT_EQ(t.pending(), ids{"strict"});
  joined = t.add_node(gpu_node("n2", 1));
  ASSERT_TRUE(joined.ok());
  EXPECT_EQ(*joined, ids{"strict"});
  EXPECT_EQ(t.bundles("strict")->front().node_id, "n2");
}

TEST(Table, StrictSpreadBeyondTheNodeCountIsInfeasibleUntilNodesJoin) {
  auto t = table_of({gpu_node("n0", 8), gpu_node("n1", 8)});
  auto r = t.create("three", gpus(placement_strategy::strict_spread, 3, 1));
  ASSERT_TRUE(r.infeasible());
  EXPECT_NE(r.reason.find("cluster has 2 nodes"), std::string::npos) << r.reason;
  ASSERT_TRUE(t.add_node(gpu_node("n2", 8)).ok());
  EXPECT_TRUE(t.create("three", gpus(placement_strategy::strict_spread, 3, 1)).placed());
  EXPECT_EQ(distinct_nodes(t.bundles("three").value()), 3u);
}

TEST(Table, RemoveNodeEvictsItsGroupsAndRequeuesThemFirst) {
  auto t = table_of({gpu_node("n0", 2), gpu_node("n1", 2)});
  ASSERT_TRUE(
      t.create("on0", req(placement_strategy::strict_pack, repeat(2, res({{"GPU", 1}})))).placed());
  ASSERT_TRUE(t.create("on1", gpus(placement_strategy::strict_pack, 1, 1)).placed());
  ASSERT_EQ(t.bundles("on0")->front().node_id, "n0");
  ASSERT_TRUE(t.create("waiting", gpus(placement_strategy::pack, 1, 1)).placed());
  ASSERT_TRUE(t.create("late", gpus(placement_strategy::pack, 1, 1)).pending());
  auto removal = t.remove_node("n0");
  ASSERT_TRUE(removal.ok());
  EXPECT_EQ(removal->evicted, ids{"on0"});
  EXPECT_TRUE(removal->placed.empty());
  EXPECT_EQ(t.pending(), (ids{"on0", "late"}));
  EXPECT_EQ(t.state("on0"), group_state::pending);
  // n1 is full (on1 and waiting); a new node takes the evicted group first.
  auto joined = t.add_node(gpu_node("n2", 2));
  ASSERT_TRUE(joined.ok());
  EXPECT_EQ(*joined, ids{"on0"});
  auto unknown = t.remove_node("n0");
  ASSERT_FALSE(unknown.ok());
  EXPECT_TRUE(error_names(unknown.error(), placement_errc::unknown_node, "n0"));
}

TEST(Table, RemoveNodeCanDropItsGroupsAndFreeTheirOtherBundles) {
  auto t = table_of({gpu_node("n0", 1), gpu_node("n1", 1)});
  // "spread" holds a GPU on both nodes; "late" waits for one.
  ASSERT_TRUE(t.create("spread", gpus(placement_strategy::strict_spread, 2, 1)).placed());
  ASSERT_TRUE(t.create("late", gpus(placement_strategy::pack, 1, 1)).pending());
  auto removal = t.remove_node("n0", evicted_groups::drop);
  ASSERT_TRUE(removal.ok());
  EXPECT_EQ(removal->evicted, ids{"spread"});
  // The dropped group is gone, and its bundle on n1 went to the waiting group.
  EXPECT_FALSE(t.state("spread").has_value());
  EXPECT_EQ(removal->placed, ids{"late"});
  EXPECT_EQ(t.bundles("late")->front().node_id, "n1");
  EXPECT_TRUE(t.pending().empty());
  EXPECT_FALSE(t.remove("spread").ok());
}

TEST(Table, CancelPendingDropsOnlyPendingGroups) {
  auto t = table_of({gpu_node("n0", 1)});
  ASSERT_TRUE(t.create("placed", gpus(placement_strategy::pack, 1, 1)).placed());
  ASSERT_TRUE(t.create("waiting", gpus(placement_strategy::pack, 1, 1)).pending());
  auto reason = t.pending_reason("waiting");
  ASSERT_TRUE(reason.ok());
  EXPECT_NE(reason->find("by placed (GPU: 1)"), std::string::npos) << *reason;
  auto placed = t.cancel_pending("placed");
  ASSERT_FALSE(placed.ok());
  EXPECT_TRUE(error_names(placed.error(), placement_errc::not_pending, "group placed"));
  ASSERT_TRUE(t.cancel_pending("waiting").ok());
  EXPECT_TRUE(t.pending().empty());
  auto unknown = t.cancel_pending("waiting");
  ASSERT_FALSE(unknown.ok());
  EXPECT_TRUE(error_names(unknown.error(), placement_errc::unknown_group, "group waiting"));
  // The canceled group does not come back when resources free up.
  EXPECT_EQ(t.remove("placed").value(), ids{});
}

TEST(Table, RejectsBadGroupIdsNamingThem) {
  auto t = table_of({gpu_node("n0", 2)});
  ASSERT_TRUE(t.create("dup", gpus(placement_strategy::pack, 1, 1)).placed());
  auto dup = t.create("dup", gpus(placement_strategy::pack, 1, 1));
  ASSERT_TRUE(dup.invalid());
  EXPECT_EQ(dup.error, placement_errc::duplicate_group);
  EXPECT_NE(dup.reason.find("group dup already exists"), std::string::npos) << dup.reason;
  EXPECT_EQ(t.cluster().node("n0")->available.get("GPU"), 10000);
  auto empty = t.create("", gpus(placement_strategy::pack, 1, 1));
  ASSERT_TRUE(empty.invalid());
  EXPECT_EQ(empty.error, placement_errc::invalid_group_id);
  auto bad = t.create("bad", req(placement_strategy::pack, {}));
  ASSERT_TRUE(bad.invalid());
  EXPECT_EQ(bad.error, placement_errc::empty_request);
  EXPECT_FALSE(t.state("bad").has_value());
  auto unknown = t.remove("ghost");
  ASSERT_FALSE(unknown.ok());
  EXPECT_TRUE(error_names(unknown.error(), placement_errc::unknown_group, "group ghost"));
  EXPECT_TRUE(error_names(t.bundles("ghost").error(), placement_errc::unknown_group, "ghost"));
  EXPECT_TRUE(error_names(t.pending_reason("dup").error(), placement_errc::not_pending, "dup"));
  EXPECT_TRUE(error_names(t.request("ghost").error(), placement_errc::unknown_group, "ghost"));
  EXPECT_TRUE(t.add_node(gpu_node("n0", 1)).error().code == placement_errc::duplicate_node);
}

TEST(Table, ReservesFractionsInsideAPlacedBundle) {
  auto t = table_of({gpu_node("n0", 4, 8)});
  ASSERT_TRUE(
      t.create("colocated", req(placement_strategy::pack, repeat(2, res({{"GPU", 1}, {"CPU", 2}}))))
          .placed());
  std::vector<std::uint64_t> held;
  for (int i = 0; i < 5; ++i) {
    auto r = t.reserve_in_bundle("colocated", 1, res({{"GPU", 0.2}, {"CPU", 0.4}}));
    ASSERT_TRUE(r.ok()) << i << ": " << r.error().message;
    EXPECT_EQ(r->device_ids, (std::vector<int>{1}));
    held.push_back(r->id);
  }
  auto sixth = t.reserve_in_bundle("colocated", 1, res({{"GPU", 0.2}}));
  ASSERT_FALSE(sixth.ok());
  EXPECT_TRUE(error_names(sixth.error(), placement_errc::insufficient_resources, "GPU: 0.2"));
  EXPECT_NE(sixth.error().message.find("group colocated"), std::string::npos);
  auto index = t.reserve_in_bundle("colocated", 2, res({{"GPU", 0.2}}));
  ASSERT_FALSE(index.ok());
  EXPECT_TRUE(error_names(index.error(), placement_errc::index_out_of_range, "bundle index 2"));
  ASSERT_TRUE(t.release_in_bundle("colocated", held[0]).ok());
  EXPECT_TRUE(t.reserve_in_bundle("colocated", 1, res({{"GPU", 0.2}})).ok());
  auto unknown = t.release_in_bundle("colocated", 999);
  ASSERT_FALSE(unknown.ok());
  EXPECT_TRUE(error_names(unknown.error(), placement_errc::unknown_reservation, "999"));
  auto view = t.allocator("colocated");
  ASSERT_TRUE(view.ok());
  EXPECT_EQ((*view)->reservation_count(), 5u);
  // Sub-allocation does not change the cluster: the bundle holds its GPUs either way.
  EXPECT_EQ(t.cluster().node("n0")->available, res({{"GPU", 2}, {"CPU", 4}}));
}

TEST(Table, SubAllocationNeedsAPlacedGroup) {
  auto t = table_of({gpu_node("n0", 1)});
  ASSERT_TRUE(t.create("a", gpus(placement_strategy::pack, 1, 1)).placed());
  ASSERT_TRUE(t.create("b", gpus(placement_strategy::pack, 1, 1)).pending());
  auto pending = t.reserve_in_bundle("b", 0, res({{"GPU", 0.5}}));
  ASSERT_FALSE(pending.ok());
  EXPECT_TRUE(error_names(pending.error(), placement_errc::not_placed, "group b"));
  auto unknown = t.reserve_in_bundle("zz", 0, res({{"GPU", 0.5}}));
  ASSERT_FALSE(unknown.ok());
  EXPECT_TRUE(error_names(unknown.error(), placement_errc::unknown_group, "group zz"));
  EXPECT_FALSE(t.allocator("b").ok());
}

TEST(Table, DescribePrintsNodesDevicesAndGroups) {
  auto t = table_of({gpu_node("n0", 2, 8), gpu_node("n1", 2, 8)});
  ASSERT_TRUE(t.create("policy", gpus(placement_strategy::strict_spread, 2, 1)).placed());
  ASSERT_TRUE(t.create("ref", gpus(placement_strategy::pack, 1, 0.5)).placed());
  ASSERT_TRUE(t.create("late", gpus(placement_strategy::pack, 3, 1)).pending());
  auto text = t.describe();
  EXPECT_NE(text.find("node n0: GPU 1.5/2 used"), std::string::npos) << text;
  EXPECT_NE(text.find("gpu 0: 1/1 used by policy[0] 1"), std::string::npos) << text;
  EXPECT_NE(text.find("gpu 1: 0.5/1 used by ref[0] 0.5"), std::string::npos) << text;
  EXPECT_NE(text.find("group policy: placed (strict_spread) [0] n0 gpu 0, [1] n1 gpu 0"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("group late: pending (pack, 3 bundles)"), std::string::npos) << text;
}
