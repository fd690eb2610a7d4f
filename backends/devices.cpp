#include "backends/devices.hpp"

#include "backends/error.hpp"

#ifdef RLFORGE_WITH_CUDA
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#include <torch/cuda.h>
#endif

namespace rlforge::backends {

namespace {

#ifdef RLFORGE_WITH_CUDA
void check_cuda(const c10::Device& device, const char* what) {
  if (!device.is_cuda())
    fail(error_code::unsupported, std::string(what) + ": " + device.str() + " is not a CUDA device");
  const int n = cuda_device_count();
  if (device.index() < 0 || device.index() >= n)
    fail(error_code::out_of_range, std::string(what) + ": " + device.str() + " is not one of the " +
                                       std::to_string(n) + " CUDA devices of this process");
}

void check_status(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess)
    fail(error_code::backend_error, what + ": " + cudaGetErrorString(status));
}
#else
[[noreturn]] void no_cuda(const c10::Device& device, const char* what) {
  fail(error_code::unsupported, std::string(what) + ": " + device.str() +
                                    ": this rlforge was built without CUDA (RLFORGE_CUDA=OFF)");
}
#endif

} // namespace

int cuda_device_count() {
#ifdef RLFORGE_WITH_CUDA
  return static_cast<int>(torch::cuda::device_count());
#else
  return 0;
#endif
}

bool built_with_cuda() noexcept {
#ifdef RLFORGE_WITH_CUDA
  return true;
#else
  return false;
#endif
}

c10::Device rank_device(const std::vector<int32_t>& device_ids) {
  if (device_ids.empty())
    return c10::Device(c10::kCPU);
  if (device_ids.front() < 0)
    fail(error_code::out_of_range,
         "rank device: device id " + std::to_string(device_ids.front()) + " is negative");
  if (device_ids.front() < cuda_device_count())
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device_ids.front()));
  return c10::Device(c10::kCPU);
}

void bind_thread_to(const c10::Device& device) {
  if (device.is_cpu())
    return;
#ifdef RLFORGE_WITH_CUDA
  check_cuda(device, "bind_thread_to");
  c10::cuda::set_device(device.index());
#else
  no_cuda(device, "bind_thread_to");
#endif
}

device_memory cuda_memory(const c10::Device& device) {
#ifdef RLFORGE_WITH_CUDA
  check_cuda(device, "cuda_memory");
  // The caching allocator of a device starts with the first tensor there (libtorch's lazy CUDA
  // start); before that it has no statistics to read. One byte starts it.
  (void)at::empty({1}, at::TensorOptions().dtype(at::kByte).device(device));
  namespace alloc = c10::cuda::CUDACachingAllocator;
  const auto stats = alloc::getDeviceStats(device.index());
  constexpr auto all = 0; // StatType::AGGREGATE
  device_memory m;
  m.allocated = stats.allocated_bytes[all].current;
  m.reserved = stats.reserved_bytes[all].current;
  m.peak_allocated = stats.allocated_bytes[all].peak;
  int previous = 0;
  check_status(cudaGetDevice(&previous), "cuda_memory: cudaGetDevice");
  check_status(cudaSetDevice(device.index()), "cuda_memory: cudaSetDevice");
  size_t free_bytes = 0, total_bytes = 0;
  auto status = cudaMemGetInfo(&free_bytes, &total_bytes);
  cudaSetDevice(previous);
  check_status(status, "cuda_memory: cudaMemGetInfo");
  m.free = static_cast<int64_t>(free_bytes);
  m.total = static_cast<int64_t>(total_bytes);
  return m;
#else
  no_cuda(device, "cuda_memory");
#endif
}

void release_cached_memory() {
#ifdef RLFORGE_WITH_CUDA
  if (cuda_device_count() > 0)
    c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

void reset_peak_memory(const c10::Device& device) {
#ifdef RLFORGE_WITH_CUDA
  if (device.is_cuda()) {
    check_cuda(device, "reset_peak_memory");
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
  }
#else
  (void)device;
#endif
}

void synchronize(const c10::Device& device) {
#ifdef RLFORGE_WITH_CUDA
  if (device.is_cuda()) {
    check_cuda(device, "synchronize");
    c10::cuda::device_synchronize();
  }
#else
  (void)device;
#endif
}

std::string describe(const c10::Device& device) {
#ifdef RLFORGE_WITH_CUDA
  if (device.is_cuda() && device.index() >= 0 && device.index() < cuda_device_count()) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device.index()) == cudaSuccess)
      return device.str() + " (" + prop.name + ")";
  }
#endif
  return device.str();
}

} // namespace rlforge::backends
