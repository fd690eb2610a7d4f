#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/Device.h>

namespace rlforge::backends {

/// Number of CUDA devices libtorch can use: the real count in a build with RLFORGE_WITH_CUDA
/// (0 when the machine has none), always 0 in the CPU build.
int cuda_device_count();

/// True when this build was compiled against a CUDA libtorch and NCCL.
bool built_with_cuda() noexcept;

/// The device a rank computes on, from its bundle's device ids (placement): `cuda:ids[0]` when
/// this process sees that CUDA device, the CPU otherwise (virtual GPUs, a machine without
/// CUDA, or a CPU build). Throws `error(out_of_range)` for a negative id.
c10::Device rank_device(const std::vector<int32_t>& device_ids);

/// Makes `device` the current CUDA device of the calling thread (nothing for the CPU). A rank
/// calls it once on its own thread before it allocates anything. Throws `error(unsupported)`
/// for a CUDA device in a CPU build, `error(out_of_range)` for a device this process lacks.
void bind_thread_to(const c10::Device& device);

/// One CUDA device's memory as its owners see it: the caching allocator of this process
/// (what live tensors hold, what it keeps reserved from the driver) and the driver (free and
/// total bytes of the device, every process counted).
struct device_memory {
  int64_t allocated = 0; ///< bytes in live tensors of this process (caching allocator)
  int64_t reserved = 0;  ///< bytes this process's caching allocator holds from the driver
  int64_t peak_allocated = 0; ///< most `allocated` since the last `reset_peak_memory`
  int64_t free = 0;      ///< cudaMemGetInfo: free bytes on the device
  int64_t total = 0;     ///< cudaMemGetInfo: the device's bytes
};

/// Reads `device`'s memory (starting libtorch's CUDA and the device's caching allocator when
/// this process has not used the device yet). Throws `error(unsupported)` in a CPU build or for
/// a CPU device, `error(out_of_range)` for a device this process lacks.
device_memory cuda_memory(const c10::Device& device);

/// Hands the caching allocator's unused cached blocks back to the driver, so that another
/// process (or role) can use them: after an offload or a sleep. No-op for the CPU.
void release_cached_memory();

/// Resets `device`'s peak counters (`device_memory::peak_allocated`). No-op for the CPU.
void reset_peak_memory(const c10::Device& device);

/// Waits for the work queued on `device` (a CUDA device's current stream). No-op for the CPU.
void synchronize(const c10::Device& device);

/// "cpu" or "cuda:N" with the device's name ("cuda:0 (NVIDIA H100 80GB HBM3)").
std::string describe(const c10::Device& device);

} // namespace rlforge::backends
