// The device memory ledger on a real CUDA device (backends/devices.hpp): what the caching
// allocator and the driver report as tensors come and go, the rank's device from its bundle's
// ids, and refusals.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "backends/devices.hpp"
#include "backends/error.hpp"
#include "gpu_support.hpp"

using namespace rlforge;
namespace be = rlforge::backends;

namespace {

constexpr int64_t mib = int64_t{1} << 20;

} // namespace

TEST(GpuMemory, TheLedgerFollowsTensorsThroughTheAllocatorAndTheDriver) {
  RLFORGE_REQUIRE_CUDA();
  const auto dev = gpu_test::cuda0();
  be::release_cached_memory();
  const auto before = be::cuda_memory(dev);
  EXPECT_GT(before.total, 0);
  EXPECT_LE(before.free, before.total);
  EXPECT_GE(before.reserved, before.allocated);
  auto t = at::empty({256 * mib}, at::TensorOptions().dtype(at::kByte).device(dev));
  const auto with = be::cuda_memory(dev);
  EXPECT_GE(with.allocated, before.allocated + 256 * mib);
  EXPECT_GE(with.reserved, with.allocated);
  EXPECT_GE(with.peak_allocated, with.allocated);
  EXPECT_LE(with.free, before.free - 200 * mib); // the driver gave the process the block
  t = at::Tensor();
  const auto cached = be::cuda_memory(dev);
  EXPECT_EQ(cached.allocated, before.allocated);
  EXPECT_GE(cached.reserved, before.reserved + 256 * mib); // still cached by the allocator
  be::release_cached_memory();
  const auto after = be::cuda_memory(dev);
  EXPECT_EQ(after.allocated, before.allocated);
  EXPECT_LE(after.reserved, before.reserved);
  EXPECT_GE(after.free, with.free + 200 * mib); // back to the driver
  be::reset_peak_memory(dev);
  EXPECT_EQ(be::cuda_memory(dev).peak_allocated, after.allocated);
}

TEST(GpuMemory, ARankComputesOnItsBundlesDeviceWhenTheProcessHasIt) {
  RLFORGE_REQUIRE_CUDA();
  EXPECT_EQ(be::rank_device({0}), gpu_test::cuda0());
  EXPECT_EQ(be::rank_device({}), c10::Device(c10::kCPU));
  // A bundle GPU this process does not see is a virtual one.
  EXPECT_EQ(be::rank_device({be::cuda_device_count()}), c10::Device(c10::kCPU));
  be::bind_thread_to(gpu_test::cuda0());
  EXPECT_NE(be::describe(gpu_test::cuda0()).find("cuda:0 ("), std::string::npos)
      << be::describe(gpu_test::cuda0());
}

TEST(GpuMemory, BadDevicesAreRefusedByName) {
  // Holds in every build: the CPU has no CUDA memory, and a negative id is no device.
  try {
    be::cuda_memory(c10::Device(c10::kCPU));
    ADD_FAILURE() << "the CPU's memory was read as a CUDA device's";
  } catch (const be::error& e) {
    EXPECT_EQ(e.code(), be::error_code::unsupported);
    EXPECT_NE(std::string(e.what()).find("cpu"), std::string::npos) << e.what();
  }
  try {
    be::rank_device({-1});
    ADD_FAILURE() << "device id -1 accepted";
  } catch (const be::error& e) {
    EXPECT_EQ(e.code(), be::error_code::out_of_range);
  }
  if (be::cuda_device_count() == 0)
    return;
  try {
    be::cuda_memory(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(be::cuda_device_count())));
    ADD_FAILURE() << "a device past the last one was read";
  } catch (const be::error& e) {
    EXPECT_EQ(e.code(), be::error_code::out_of_range);
  }
}
