#include "placement/bundle_allocator.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/placement/helpers.hpp"

using namespace rlforge::placement;
using namespace rlforge::placement::test_support;

namespace {

bundle_allocator allocator_for(std::vector<placed_bundle> bundles) {
  auto made = bundle_allocator::make(bundles);
  EXPECT_TRUE(made.ok()) << (made.ok() ? "" : made.error().message);
  return made.ok() ? std::move(made.value()) : bundle_allocator{};
}

} // namespace

TEST(BundleAllocator, FiveFifthsOfAGpuFitAndASixthDoesNot) {
  auto alloc = allocator_for({placed_bundle{0, "n0", {3}, res({{"GPU", 1}, {"CPU", 4}})}});
  std::vector<std::uint64_t> ids;
  for (int i = 0; i < 5; ++i) {
    auto r = alloc.reserve_gpu(0, 0.2);
    ASSERT_TRUE(r.ok()) << i << ": " << r.error().message;
    EXPECT_EQ(r->device_ids, (std::vector<int>{3}));
    EXPECT_EQ(r->node_id, "n0");
    ids.push_back(r->id);
  }
  EXPECT_EQ(alloc.available(0)->get("GPU"), 0);
  auto sixth = alloc.reserve_gpu(0, 0.2);
  ASSERT_FALSE(sixth.ok());
  EXPECT_TRUE(error_names(sixth.error(), placement_errc::insufficient_resources, "GPU: 0.2"));
  EXPECT_NE(sixth.error().message.find("5 reservations"), std::string::npos)
      << sixth.error().message;
  ASSERT_TRUE(alloc.release(ids[2]).ok());
  EXPECT_TRUE(alloc.reserve_gpu(0, 0.2).ok());
  EXPECT_EQ(alloc.reservation_count(), 5u);
}

TEST(BundleAllocator, TenthsAndSevenTenthsFillAGpuExactly) {
  auto alloc = allocator_for({placed_bundle{0, "n0", {0}, res({{"GPU", 1}})}});
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(alloc.reserve_gpu(0, 0.1).ok());
  ASSERT_TRUE(alloc.reserve_gpu(0, 0.7).ok());
  EXPECT_EQ(alloc.device_available(0).value(), (std::vector<units>{0}));
  auto more = alloc.reserve_gpu(0, 0.0001);
  ASSERT_FALSE(more.ok());
  EXPECT_TRUE(error_names(more.error(), placement_errc::insufficient_resources, "GPU: 0.0001"));
}

TEST(BundleAllocator, CpuSharesOfABundleAreExact) {
  auto alloc = allocator_for({placed_bundle{0, "n0", {}, res({{"CPU", 2}})},
                              placed_bundle{1, "n1", {}, res({{"CPU", 1}, {"memory", 100}})}});
  for (int i = 0; i < 4; ++i)
    ASSERT_TRUE(alloc.reserve(0, res({{"CPU", 0.5}})).ok()) << i;
  auto fifth = alloc.reserve(0, res({{"CPU", 0.5}}));
  ASSERT_FALSE(fifth.ok());
  EXPECT_TRUE(error_names(fifth.error(), placement_errc::insufficient_resources, "CPU: 0.5"));
  auto other = alloc.reserve(1, res({{"CPU", 0.25}, {"memory", 60}}));
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->node_id, "n1");
  EXPECT_TRUE(other->device_ids.empty());
  EXPECT_EQ(alloc.available(1).value(), res({{"CPU", 0.75}, {"memory", 40}}));
  auto gpu = alloc.reserve(1, res({{"GPU", 0.1}}));
  ASSERT_FALSE(gpu.ok());
  EXPECT_TRUE(error_names(gpu.error(), placement_errc::insufficient_resources, "GPU: 0.1"));
}

TEST(BundleAllocator, MultiGpuBundlesShareDevicesMostUsedFirst) {
  auto alloc = allocator_for({placed_bundle{0, "n0", {3, 5}, res({{"GPU", 2}})}});
  auto a = alloc.reserve_gpu(0, 0.5);
  auto b = alloc.reserve_gpu(0, 0.5);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->device_ids, (std::vector<int>{3}));
  EXPECT_EQ(b->device_ids, (std::vector<int>{3})); // the used device still fits: keep 5 whole
  auto whole = alloc.reserve(0, res({{"GPU", 1}}));
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->device_ids, (std::vector<int>{5}));
  ASSERT_TRUE(alloc.release(a->id).ok());
  auto again = alloc.reserve(0, res({{"GPU", 1}}));
  ASSERT_FALSE(again.ok()); // 0.5 is left in total, on device 3
  EXPECT_TRUE(error_names(again.error(), placement_errc::insufficient_resources, "GPU: 1"));
  ASSERT_TRUE(alloc.release(b->id).ok());
  auto both = alloc.reserve_gpu(0, 0.9);
  ASSERT_TRUE(both.ok());
  EXPECT_EQ(both->device_ids, (std::vector<int>{3}));
  EXPECT_EQ(alloc.device_available(0).value(), (std::vector<units>{1000, 0}));
}

TEST(BundleAllocator, NoWholeDeviceLeftIsReportedWithDeviceShares) {
  auto alloc = allocator_for({placed_bundle{0, "n0", {0, 1}, res({{"GPU", 2}})}});
  ASSERT_TRUE(alloc.reserve_gpu(0, 0.6).ok());
  ASSERT_TRUE(alloc.reserve_gpu(0, 0.6).ok()); // device 0 has only 0.4 left: goes to device 1
  auto whole = alloc.reserve(0, res({{"GPU", 0.8}}));
  ASSERT_FALSE(whole.ok()); // 0.8 is free in total but no device has 0.8
  EXPECT_TRUE(error_names(whole.error(), placement_errc::insufficient_resources, "GPU: 0.8"));
  EXPECT_NE(whole.error().message.find("device 0: 0.4, device 1: 0.4"), std::string::npos)
      << whole.error().message;
}

TEST(BundleAllocator, RejectsBadIndicesAmountsAndReservationIds) {
  auto alloc = allocator_for({placed_bundle{0, "n0", {0}, res({{"GPU", 1}})}});
  auto index = alloc.reserve_gpu(4, 0.2);
  ASSERT_FALSE(index.ok());
  EXPECT_TRUE(error_names(index.error(), placement_errc::index_out_of_range, "bundle index 4"));
  auto negative = alloc.reserve_gpu(0, -0.2);
  ASSERT_FALSE(negative.ok());
  EXPECT_TRUE(error_names(negative.error(), placement_errc::invalid_amount, "-0.2"));
  auto nan = alloc.reserve_gpu(0, std::nan(""));
  ASSERT_FALSE(nan.ok());
  EXPECT_TRUE(error_names(nan.error(), placement_errc::invalid_amount, "NaN"));
  auto zero = alloc.reserve_gpu(0, 0);
  ASSERT_FALSE(zero.ok());
  EXPECT_TRUE(error_names(zero.error(), placement_errc::invalid_amount, "GPU is 0"));
  auto release = alloc.release(77);
  ASSERT_FALSE(release.ok());
  EXPECT_TRUE(error_names(release.error(), placement_errc::unknown_reservation, "77"));
  EXPECT_FALSE(alloc.available(1).ok());
  EXPECT_FALSE(alloc.device_available(1).ok());
  EXPECT_EQ(alloc.reservation_count(), 0u);
}

TEST(BundleAllocator, EmptyRequestNamesTheNodeWithoutHoldingAnything) {
  auto alloc = allocator_for({placed_bundle{0, "n7", {}, res({{"CPU", 1}})}});
  auto r = alloc.reserve(0, resource_set{});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->node_id, "n7");
  EXPECT_EQ(alloc.available(0).value(), res({{"CPU", 1}}));
  ASSERT_NE(alloc.find(r->id), nullptr);
  ASSERT_TRUE(alloc.release(r->id).ok());
  EXPECT_EQ(alloc.find(r->id), nullptr);
}

TEST(BundleAllocator, MakeRejectsInconsistentBundles) {
  auto repeated = bundle_allocator::make(
      {placed_bundle{0, "n", {}, res({{"CPU", 1}})}, placed_bundle{0, "n", {}, res({{"CPU", 1}})}});
  ASSERT_FALSE(repeated.ok());
  EXPECT_TRUE(error_names(repeated.error(), placement_errc::invalid_reservation, "index 0"));
  auto devices = bundle_allocator::make({placed_bundle{0, "n", {}, res({{"GPU", 1}})}});
  ASSERT_FALSE(devices.ok());
  EXPECT_TRUE(error_names(devices.error(), placement_errc::invalid_reservation, "0 devices"));
}
