#pragma once

namespace rlforge::backends {

/// Number of CUDA devices libtorch can use: the real count in a build with RLFORGE_WITH_CUDA
/// (0 when the machine has none), always 0 in the CPU build.
int cuda_device_count();

/// True when this build was compiled against a CUDA libtorch and NCCL.
bool built_with_cuda() noexcept;

} // namespace rlforge::backends
