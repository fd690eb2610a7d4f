#include "backends/threads.hpp"

#include <ATen/Parallel.h>

#include "backends/error.hpp"

#include <string>

namespace rlforge::backends {

void set_intra_op_threads(int n) {
  if (n < 1)
    fail(error_code::invalid_argument, "intra-op thread count must be >= 1, got " + std::to_string(n));
  at::set_num_threads(n);
}

int intra_op_threads() {
  return at::get_num_threads();
}

} // namespace rlforge::backends
