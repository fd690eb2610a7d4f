#include "backends/error.hpp"

namespace rlforge::backends {

const char* to_string(error_code x) noexcept {
  switch (x) {
    case error_code::invalid_argument: return "invalid_argument";
    case error_code::out_of_range: return "out_of_range";
    case error_code::not_found: return "not_found";
    case error_code::decode_error: return "decode_error";
    case error_code::io_error: return "io_error";
    case error_code::unsupported: return "unsupported";
    case error_code::timeout: return "timeout";
    case error_code::backend_error: return "backend_error";
    case error_code::internal: return "internal";
  }
  return "unknown";
}

void fail(error_code code, const std::string& message) {
  throw error(code, message);
}

} // namespace rlforge::backends
