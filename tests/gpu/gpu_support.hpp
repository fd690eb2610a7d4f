/// Shared by the CUDA tests (tests/gpu): the skip when this process has no CUDA device, the
/// device they use, and a small random model. Header-only.
///
/// A rehearsal on a machine without a GPU (scripts/gpu-check sets RLFORGE_GPU_TESTS_ON_CPU=1)
/// runs the tests whose logic also holds on the CPU there, the CPU standing in for the device
/// (`RLFORGE_REQUIRE_DEVICE`), so that their code has run before device time is spent; what
/// only a CUDA device has (its memory, NCCL, CUDA IPC) still needs `RLFORGE_REQUIRE_CUDA`.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include <c10/core/Device.h>

#include "backends/devices.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/model_config.hpp"

/// Skips the calling test unless this process sees a CUDA device (a CPU build never does).
#define RLFORGE_REQUIRE_CUDA()                                                                 \
  do {                                                                                         \
    if (!::rlforge::backends::built_with_cuda())                                               \
      GTEST_SKIP() << "built without CUDA (RLFORGE_CUDA=OFF)";                                 \
    if (::rlforge::backends::cuda_device_count() == 0)                                         \
      GTEST_SKIP() << "no CUDA device";                                                        \
  } while (0)

namespace rlforge::gpu_test {

/// True in a CPU rehearsal (RLFORGE_GPU_TESTS_ON_CPU=1) on a machine without CUDA devices.
inline bool rehearsing_on_cpu() {
  const char* v = std::getenv("RLFORGE_GPU_TESTS_ON_CPU");
  return v && std::strcmp(v, "1") == 0 && backends::cuda_device_count() == 0;
}

/// The device under test: cuda:0, or the CPU in a rehearsal.
inline c10::Device cuda0() {
  return rehearsing_on_cpu() ? c10::Device(c10::kCPU) : c10::Device(c10::kCUDA, 0);
}

/// A Llama-shaped model larger than the "tiny" preset (so that device memory moves by whole
/// megabytes) and small enough for exact CPU references: 4 layers, hidden 256, vocab 4096.
inline backends::model_config small_config() {
  return backends::preset("small");
}

inline std::unique_ptr<backends::causal_lm> random_model(uint64_t seed = 7,
                                                         const std::string& preset = "small") {
  return backends::causal_lm::random(backends::preset(preset), seed);
}

} // namespace rlforge::gpu_test

/// Skips the calling test unless there is a CUDA device or this is a CPU rehearsal.
#define RLFORGE_REQUIRE_DEVICE()                                                               \
  do {                                                                                         \
    if (!::rlforge::gpu_test::rehearsing_on_cpu())                                             \
      RLFORGE_REQUIRE_CUDA();                                                                  \
  } while (0)
