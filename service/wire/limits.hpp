#pragma once

#include <cstddef>

namespace rlforge::service {

/// Limits every decoder of the Tinker wire formats applies (syntax only: what a model accepts is
/// checked by the backend, tinker/datum_check.hpp).
struct wire_limits {
  /// Largest body accepted after decompression; also the zstd output limit and the bound on a
  /// sparse tensor's dense size.
  size_t max_body_bytes = size_t{512} << 20;
};

} // namespace rlforge::service
