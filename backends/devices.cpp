#include "backends/devices.hpp"

#ifdef RLFORGE_WITH_CUDA
#include <torch/cuda.h>
#endif

namespace rlforge::backends {

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

} // namespace rlforge::backends
