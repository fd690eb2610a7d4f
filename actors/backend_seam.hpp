#pragma once

#include <exception>
#include <string>
#include <utility>

#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "backends/error.hpp"
#include "runtime/errc.hpp"

namespace rlforge::actors {

/// Maps a backend error code to the `errc` with the same meaning.
errc to_errc(backends::error_code code) noexcept;

/// Converts the exception in flight (a `backends::error`, a torch `c10::Error`, any
/// `std::exception`) into a `caf::error` whose message starts with `context`, e.g.
/// "policy rank 1 forward_backward". Call only from inside a `catch` block.
caf::error current_exception_to_error(const std::string& context);

/// Runs `f()` at the actor/backend seam: returns its value, or the error its exception maps to.
/// An exception never escapes (it would kill the actor).
template <class F>
auto call_backend(const std::string& context, F&& f) -> caf::expected<decltype(f())> {
  try {
    return std::forward<F>(f)();
  } catch (...) {
    return current_exception_to_error(context);
  }
}

} // namespace rlforge::actors
