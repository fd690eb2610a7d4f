#pragma once

#include <stdexcept>
#include <string>

/// The one exception type of env/: what made an episode (or an environment process) fail.
namespace rlforge::env {

/// Why an environment call failed. Every kind fails the episode, never the job.
enum class failure {
  spawn,       ///< the process could not be started (missing executable, bad directory, ...)
  handshake,   ///< no, malformed or incompatible handshake line
  timeout,     ///< no answer within the call's timeout; the process group was killed
  crashed,     ///< the process exited or closed its stdout (or stdin) mid-call
  protocol,    ///< a reply that breaks the protocol: not JSON, wrong id, missing or mistyped
               ///< fields, over the line limit, invalid UTF-8
  environment, ///< the environment itself reported an error for the request
  usage,       ///< a call out of order: step before reset, after done, after close or failure
};

/// "spawn", "handshake", "timeout", "crashed", "protocol", "environment" or "usage".
const char* to_string(failure x) noexcept;

/// Thrown by environments. `what()` reads "environment <kind>: <detail>", followed, for a
/// process, by the last lines the child wrote to stderr (`stderr_tail()`).
class env_error : public std::runtime_error {
public:
  env_error(failure kind, const std::string& detail, std::string stderr_tail = {});

  failure kind() const noexcept { return kind_; }
  const std::string& detail() const noexcept { return detail_; }
  const std::string& stderr_tail() const noexcept { return stderr_tail_; }

private:
  failure kind_;
  std::string detail_;
  std::string stderr_tail_;
};

} // namespace rlforge::env
