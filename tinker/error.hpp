#pragma once

#include <stdexcept>
#include <string>

/// The one error type of the Tinker request path, from the worker that computes a request to the
/// HTTP status the service answers with (std only).
namespace rlforge::tinker {

/// Whose fault a failed request is, and so how the service reports it.
enum class error_category {
  user,      ///< bad input: HTTP 400, future category "user"
  not_found, ///< an unknown model, session, sampler or checkpoint: HTTP 404, category "user"
  server,    ///< a failure of the runtime: HTTP 500, future category "server"
};

/// "user", "not_found" or "server".
const char* to_string(error_category x) noexcept;

/// The HTTP status a request refused with `x` gets: 400, 404 or 500.
int http_status(error_category x) noexcept;

/// The category a failed future reports to the SDK, which knows "user", "server" and "unknown":
/// `not_found` is the user's.
const char* future_category(error_category x) noexcept;

/// What every function of the request path throws for a request it refuses or cannot compute;
/// the message names what was wrong (the request, datum, field and value where there is one).
class request_error : public std::runtime_error {
public:
  request_error(error_category category, const std::string& message);

  error_category category() const noexcept { return category_; }

private:
  error_category category_;
};

/// Throws `request_error(error_category::user, message)`.
[[noreturn]] void fail_user(const std::string& message);

/// Throws `request_error(error_category::not_found, message)`.
[[noreturn]] void fail_not_found(const std::string& message);

/// Throws `request_error(error_category::server, message)`.
[[noreturn]] void fail_server(const std::string& message);

} // namespace rlforge::tinker
