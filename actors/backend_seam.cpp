#include "actors/backend_seam.hpp"

#include <c10/util/Exception.h>

namespace rlforge::actors {

errc to_errc(backends::error_code code) noexcept {
  using backends::error_code;
  switch (code) {
    case error_code::invalid_argument: return errc::invalid_argument;
    case error_code::out_of_range: return errc::out_of_range;
    case error_code::not_found: return errc::not_found;
    case error_code::decode_error: return errc::decode_error;
    case error_code::io_error: return errc::io_error;
    case error_code::unsupported: return errc::unsupported;
    case error_code::timeout: return errc::timeout;
    case error_code::backend_error: return errc::backend_error;
    case error_code::internal: return errc::internal;
  }
  return errc::internal;
}

caf::error current_exception_to_error(const std::string& context) {
  auto prefix = context.empty() ? std::string{} : context + ": ";
  try {
    throw;
  } catch (const backends::error& e) {
    return make_error(to_errc(e.code()), prefix + e.what());
  } catch (const c10::Error& e) {
    // what_without_backtrace keeps the message readable; the backtrace goes to debug logs.
    return make_error(errc::backend_error, prefix + e.what_without_backtrace());
  } catch (const std::bad_alloc&) {
    return make_error(errc::backend_error, prefix + "out of memory");
  } catch (const std::exception& e) {
    return make_error(errc::backend_error, prefix + e.what());
  } catch (...) {
    return make_error(errc::internal, prefix + "unknown exception");
  }
}

} // namespace rlforge::actors
