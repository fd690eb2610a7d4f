#include "placement/cluster.hpp"

#include <gtest/gtest.h>

#include "tests/placement/helpers.hpp"

using namespace rlforge::placement;
using namespace rlforge::placement::test_support;

namespace {

placed_bundle bundle_on(std::size_t index, std::string node, std::vector<int> devices,
                        resource_set resources) {
  placed_bundle b;
  b.request_index = index;
  b.node_id = std::move(node);
  b.device_ids = std::move(devices);
  b.resources = std::move(resources);
  return b;
}

} // namespace

TEST(Cluster, AddNodeDerivesDevicesFromAWholeGpuCount) {
  cluster_state c;
  node_spec n;
  n.id = "n0";
  n.resources = res({{"GPU", 2}, {"CPU", 8}, {"memory", 1e9}});
  ASSERT_TRUE(c.add_node(n).ok());
  auto status = c.node("n0");
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->device_capacity, (std::vector<units>{10000, 10000}));
  EXPECT_EQ(status->total, res({{"GPU", 2}, {"CPU", 8}, {"memory", 1e9}}));
  EXPECT_EQ(status->available, status->total);
}

TEST(Cluster, AddNodeAcceptsPartialDevicesMatchingTheGpuTotal) {
  cluster_state c;
  node_spec n;
  n.id = "slices";
  n.gpu_devices = {5000, 5000, 10000};
  ASSERT_TRUE(c.add_node(n).ok());
  EXPECT_EQ(c.node("slices")->total.get("GPU"), 20000);
  n.id = "declared";
  n.resources = res({{"GPU", 2}});
  ASSERT_TRUE(c.add_node(n).ok());
}

TEST(Cluster, AddNodeRejectsBadNodesNamingTheProblem) {
  cluster_state c;
  node_spec empty_id;
  auto e1 = c.add_node(empty_id);
  ASSERT_FALSE(e1.ok());
  EXPECT_TRUE(error_names(e1.error(), placement_errc::invalid_node, "id is empty"));

  ASSERT_TRUE(c.add_node(gpu_node("n0", 1)).ok());
  auto dup = c.add_node(gpu_node("n0", 2));
  ASSERT_FALSE(dup.ok());
  EXPECT_TRUE(error_names(dup.error(), placement_errc::duplicate_node, "n0"));

  node_spec big_device{"n1", {}, {10000, 15000}};
  auto e2 = c.add_node(big_device);
  ASSERT_FALSE(e2.ok());
  EXPECT_TRUE(error_names(e2.error(), placement_errc::invalid_node, "device 1 has capacity 1.5"));

  node_spec zero_device{"n1", {}, {0}};
  auto e3 = c.add_node(zero_device);
  ASSERT_FALSE(e3.ok());
  EXPECT_TRUE(error_names(e3.error(), placement_errc::invalid_node, "capacity 0"));

  node_spec mismatch{"n1", res({{"GPU", 3}}), {10000, 10000}};
  auto e4 = c.add_node(mismatch);
  ASSERT_FALSE(e4.ok());
  EXPECT_TRUE(error_names(e4.error(), placement_errc::invalid_node, "GPU: 3"));

  node_spec fractional{"n1", res({{"GPU", 1.5}}), {}};
  auto e5 = c.add_node(fractional);
  ASSERT_FALSE(e5.ok());
  EXPECT_TRUE(error_names(e5.error(), placement_errc::invalid_node, "GPU: 1.5"));
  EXPECT_EQ(c.node_count(), 1u);
}

TEST(Cluster, MakeNodeRejectsNegativeCountsAndBadAmounts) {
  auto gpus = make_node("n", -1, 4);
  ASSERT_FALSE(gpus.ok());
  EXPECT_TRUE(error_names(gpus.error(), placement_errc::invalid_node, "-1 GPUs"));
  auto cpus = make_node("n", 1, -4);
  ASSERT_FALSE(cpus.ok());
  EXPECT_TRUE(error_names(cpus.error(), placement_errc::invalid_amount, "-4"));
  auto id = make_node("", 1, 4);
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.error().code, placement_errc::invalid_node);
  auto extra = make_node("n", 1, 4, res({{"GPU", 1}}));
  ASSERT_FALSE(extra.ok());
  EXPECT_TRUE(error_names(extra.error(), placement_errc::invalid_node, "GPU: 1"));
}

TEST(Cluster, ReserveIsAllOrNothing) {
  auto c = cluster_of({gpu_node("n0", 2, 4)});
  auto before = c.describe();
  std::vector<placed_bundle> bundles{bundle_on(0, "n0", {0}, res({{"GPU", 1}, {"CPU", 2}})),
                                     bundle_on(1, "n0", {1}, res({{"GPU", 1}, {"CPU", 3}}))};
  auto ok = c.reserve("g", bundles);
  ASSERT_FALSE(ok.ok());
  EXPECT_TRUE(error_names(ok.error(), placement_errc::insufficient_resources, "CPU: 3"));
  EXPECT_EQ(c.describe(), before);
  EXPECT_EQ(c.node("n0")->available, res({{"GPU", 2}, {"CPU", 4}}));
  EXPECT_EQ(c.group_count(), 0u);
}

TEST(Cluster, ReserveRejectsInconsistentDevicesAndUnknownNodes) {
  auto c = cluster_of({gpu_node("n0", 2, 4)});
  auto wrong_count = c.reserve("g", {bundle_on(0, "n0", {0}, res({{"GPU", 2}}))});
  ASSERT_FALSE(wrong_count.ok());
  EXPECT_TRUE(error_names(wrong_count.error(), placement_errc::invalid_reservation, "1 devices"));
  auto bad_device = c.reserve("g", {bundle_on(0, "n0", {7}, res({{"GPU", 1}}))});
  ASSERT_FALSE(bad_device.ok());
  EXPECT_TRUE(error_names(bad_device.error(), placement_errc::invalid_reservation, "device 7"));
  auto twice = c.reserve("g", {bundle_on(0, "n0", {1, 1}, res({{"GPU", 2}}))});
  ASSERT_FALSE(twice.ok());
  EXPECT_TRUE(error_names(twice.error(), placement_errc::invalid_reservation, "twice"));
  auto node = c.reserve("g", {bundle_on(0, "n9", {}, res({{"CPU", 1}}))});
  ASSERT_FALSE(node.ok());
  EXPECT_TRUE(error_names(node.error(), placement_errc::unknown_node, "n9"));
  auto none = c.reserve("g", {});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code, placement_errc::empty_request);
  ASSERT_TRUE(c.reserve("g", {bundle_on(0, "n0", {1}, res({{"GPU", 0.5}}))}).ok());
  auto dup = c.reserve("g", {bundle_on(0, "n0", {}, res({{"CPU", 1}}))});
  ASSERT_FALSE(dup.ok());
  EXPECT_TRUE(error_names(dup.error(), placement_errc::duplicate_group, "group g"));
}

TEST(Cluster, ReleaseRestoresExactlyWhatWasReserved) {
  auto c = cluster_of({gpu_node("n0", 2, 4)});
  ASSERT_TRUE(c.reserve("a", {bundle_on(0, "n0", {0}, res({{"GPU", 0.3}, {"CPU", 1}}))}).ok());
  ASSERT_TRUE(c.reserve("b", {bundle_on(0, "n0", {0}, res({{"GPU", 0.7}, {"CPU", 0.5}}))}).ok());
  auto status = c.node("n0");
  EXPECT_EQ(status->device_free, (std::vector<units>{0, 10000}));
  EXPECT_EQ(status->available, res({{"GPU", 1}, {"CPU", 2.5}}));
  auto released = c.release("a");
  ASSERT_TRUE(released.ok());
  EXPECT_EQ(released->size(), 1u);
  EXPECT_EQ(c.node("n0")->device_free, (std::vector<units>{3000, 10000}));
  auto unknown = c.release("a");
  ASSERT_FALSE(unknown.ok());
  EXPECT_TRUE(error_names(unknown.error(), placement_errc::unknown_group, "group a"));
}

TEST(Cluster, RemoveNodeReleasesTheGroupsOnIt) {
  auto c = cluster_of({gpu_node("n0", 1), gpu_node("n1", 1)});
  ASSERT_TRUE(c.reserve("both", {bundle_on(0, "n0", {0}, res({{"GPU", 1}})),
                                 bundle_on(1, "n1", {0}, res({{"GPU", 0.5}}))})
                  .ok());
  ASSERT_TRUE(c.reserve("only1", {bundle_on(0, "n1", {0}, res({{"GPU", 0.5}}))}).ok());
  auto evicted = c.remove_node("n0");
  ASSERT_TRUE(evicted.ok());
  EXPECT_EQ(*evicted, (std::vector<std::string>{"both"}));
  EXPECT_EQ(c.node("n1")->device_free, (std::vector<units>{5000}));
  EXPECT_EQ(c.group_ids(), (std::vector<std::string>{"only1"}));
  auto unknown = c.remove_node("n0");
  ASSERT_FALSE(unknown.ok());
  EXPECT_TRUE(error_names(unknown.error(), placement_errc::unknown_node, "n0"));
  EXPECT_FALSE(c.node("n0").ok());
}

TEST(Cluster, DescribeShowsUsagePerResourceAndDeviceHolders) {
  auto c = cluster_of({gpu_node("n0", 2, 8)});
  ASSERT_TRUE(c.reserve("g1", {bundle_on(0, "n0", {1}, res({{"GPU", 0.4}, {"CPU", 2}}))}).ok());
  auto text = c.describe();
  EXPECT_NE(text.find("node n0: GPU 0.4/2 used, CPU 2/8 used"), std::string::npos) << text;
  EXPECT_NE(text.find("gpu 0: 0/1 free"), std::string::npos) << text;
  EXPECT_NE(text.find("gpu 1: 0.4/1 used by g1[0] 0.4"), std::string::npos) << text;
}
