#pragma once

#include <cstdint>
#include <string>

#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/make_message.hpp>

namespace rlforge {

/// Every error code rlforge puts into a `caf::error`. Registered with CAF as the error category
/// `rlforge` (see `runtime/type_registry.hpp`), so errors cross nodes and render readably.
enum class errc : uint8_t {
  none = 0,
  invalid_argument,   ///< a value the caller passed is malformed or out of its domain
  out_of_range,       ///< an index or id outside the valid range
  not_found,          ///< a named object (group, model, node, file) does not exist
  already_exists,     ///< a named object exists and may not be created twice
  infeasible,         ///< no node could ever satisfy a resource request
  timeout,            ///< an operation did not finish within its deadline
  rank_failed,        ///< a rank of an actor group died or failed an operation
  decode_error,       ///< bytes on the wire or on disk could not be decoded
  io_error,           ///< a file or socket operation failed
  unsupported,        ///< the build or the device lacks a feature
  backend_error,      ///< a compute backend (torch, c10d) reported a failure
  busy,               ///< the receiver is temporarily unable to take more work
  internal,           ///< a broken invariant; a bug
};

/// The CAF category atom of `errc` errors.
constexpr caf::atom_value errc_category = caf::atom("rlforge");

/// Returns the enumerator's name, e.g. "invalid_argument".
const char* to_string(errc x) noexcept;

/// Renders an `errc` error (code and context message) as "rlforge.<code>: <context>".
std::string render_errc(uint8_t code, const caf::message& context);

/// Builds an error with a human-readable message naming what was wrong.
inline caf::error make_error(errc code, std::string message) {
  return caf::error{static_cast<uint8_t>(code), errc_category,
                    caf::make_message(std::move(message))};
}

/// Builds an error without a message.
inline caf::error make_error(errc code) {
  return caf::error{static_cast<uint8_t>(code), errc_category};
}

/// True when `err` is an rlforge error with the given code.
inline bool is(const caf::error& err, errc code) {
  return err && err.category() == errc_category && err.code() == static_cast<uint8_t>(code);
}

/// The message of an rlforge error (empty when there is none or it is another category).
std::string error_message(const caf::error& err);

} // namespace rlforge
