#pragma once
// The one place where rlforge meets differences between the libtorch versions it builds
// against: Debian's 1.13 (CPU) and the 2.x inside a PyTorch install (CPU or CUDA). Everything
// else is written against the API both share. Include it only where one of these is needed.
//
//  - RLFORGE_TORCH_AT_LEAST(major, minor): the libtorch being compiled against is at least
//    that version.
//  - c10d_backend: the base class of ProcessGroupGloo / ProcessGroupNCCL, whose allreduce,
//    broadcast and barrier rlforge calls (c10d::ProcessGroup in 1.x; c10d::Backend in 2.x,
//    where ProcessGroup became a dispatcher over backends).
//  - RLFORGE_C10D_STORE_HAS_CLONE: c10d::Store declares `clone()` pure virtual (2.8 and later),
//    so a Store subclass must give a handle that shares its state.
#include <torch/version.h>

#define RLFORGE_TORCH_AT_LEAST(major, minor)                                                    \
  (TORCH_VERSION_MAJOR > (major) ||                                                           \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

#if RLFORGE_TORCH_AT_LEAST(2, 0)
#include <torch/csrc/distributed/c10d/Backend.hpp>
namespace rlforge::backends {
using c10d_backend = c10d::Backend;
}
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
namespace rlforge::backends {
using c10d_backend = c10d::ProcessGroup;
}
#endif

#if RLFORGE_TORCH_AT_LEAST(2, 8)
#define RLFORGE_C10D_STORE_HAS_CLONE 1
#else
#define RLFORGE_C10D_STORE_HAS_CLONE 0
#endif
