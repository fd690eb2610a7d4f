#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "env/environment.hpp"
#include "env/process.hpp"

/// An environment that runs as a separate process, in any language, speaking the JSON-lines
/// protocol of env/protocol.hpp over its stdin/stdout (docs/ENVIRONMENTS.md;
/// examples/envs/rlforge_env.py implements the loop for Python).
///
/// Construction starts the process and waits for its handshake. Each call writes one request
/// and waits for its reply, at most `call_timeout`. A hung, dead or garbage-printing process
/// (timeout, exit, closed pipe, a line that is not JSON, a wrong id, missing or mistyped fields,
/// a line over `max_line_bytes`, invalid UTF-8) makes the call throw env_error with the reason
/// and the tail of the process's stderr; the process group is killed and reaped at once and
/// the environment is no longer `usable()` — start a new one for the next episode. An error the
/// environment reports itself (an "error" reply) fails only the episode: the process stays up
/// and can be reset.
///
/// Thread safety: one thread at a time per environment; separate environments (processes) may
/// be driven from different threads concurrently.
namespace rlforge::env {

struct subprocess_options {
  process_spec process;
  std::chrono::milliseconds handshake_timeout{10000};
  std::chrono::milliseconds call_timeout{30000};
  /// How long `close` waits for the close reply and then for the process to exit by itself
  /// before killing its group.
  std::chrono::milliseconds close_timeout{2000};
  std::size_t max_line_bytes = std::size_t{1} << 20;
};

class subprocess_environment : public environment {
public:
  /// Starts the process and checks its handshake. Throws env_error (spawn, handshake, timeout,
  /// crashed) with the stderr tail; nothing is left running on failure.
  explicit subprocess_environment(subprocess_options options);
  ~subprocess_environment() override;

  subprocess_environment(const subprocess_environment&) = delete;
  subprocess_environment& operator=(const subprocess_environment&) = delete;

  reset_result reset(const reset_request& request) override;
  step_result step(const std::string& action) override;

  /// Sends `close`, waits up to `close_timeout` for the reply and the exit, then kills the
  /// process group and reaps it. Never throws; idempotent.
  void close() override;

  bool usable() const override { return process_ && process_->running() && !failed_; }

  /// The process id (also its process group id); -1 once reaped.
  pid_t pid() const noexcept { return process_ ? process_->pid() : -1; }

private:
  nlohmann::json call(const std::string& method, const std::string& line);
  [[noreturn]] void fail(failure kind, const std::string& detail);

  subprocess_options options_;
  std::unique_ptr<child_process> process_;
  int64_t next_id_ = 1;
  bool running_ = false;
  bool failed_ = false;
};

} // namespace rlforge::env
