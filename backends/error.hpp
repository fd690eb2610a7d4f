#pragma once

#include <stdexcept>
#include <string>

namespace rlforge::backends {

/// What went wrong in a backend. The actor that calls a backend maps these onto `rlforge::errc`
/// at that seam (same names).
enum class error_code {
  invalid_argument, ///< a value passed in is malformed or outside its domain
  out_of_range,     ///< an index or token id outside the valid range
  not_found,        ///< a file, tensor or name does not exist
  decode_error,     ///< bytes (a file, a header) could not be decoded
  io_error,         ///< a read or write failed
  unsupported,      ///< the build or the device lacks a feature
  timeout,          ///< a collective or rendezvous did not finish in time
  backend_error,    ///< libtorch / c10d reported a failure
  internal,         ///< a broken invariant
};

/// Returns the enumerator's name, e.g. "invalid_argument".
const char* to_string(error_code x) noexcept;

/// The one exception type backends throw: a code plus a message that names the bad value.
class error : public std::runtime_error {
public:
  error(error_code code, const std::string& message)
    : std::runtime_error(message), code_(code) {}

  error_code code() const noexcept { return code_; }

private:
  error_code code_;
};

/// Throws `error{code, message}`.
[[noreturn]] void fail(error_code code, const std::string& message);

} // namespace rlforge::backends
