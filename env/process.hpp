#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "env/error.hpp"

/// A child process with a pipe pair for a line protocol: the parent writes lines to its stdin
/// and reads lines from its stdout; its stderr is drained into a bounded tail buffer for error
/// messages. The child runs in its own process group, so `kill` reaches everything it started.
///
/// Started with posix_spawn(p) (pipes created O_CLOEXEC, so concurrent spawns from several
/// threads leak no descriptors into each other's children). Every read and write takes a
/// deadline and waits with poll; nothing blocks without one.
///
/// Thread safety: one thread drives a process at a time. Destruction kills the process group
/// and reaps the child.
namespace rlforge::env {

/// How to start a child.
struct process_spec {
  std::vector<std::string> argv; ///< argv[0] is looked up on PATH when it has no '/'
  std::string working_directory; ///< empty: the parent's
  std::map<std::string, std::string> environment; ///< set (or override) these variables
  bool inherit_environment = true;                ///< false: the child sees only `environment`
};

class child_process {
public:
  /// Starts the child. Throws env_error (spawn) naming the program and the reason.
  explicit child_process(const process_spec& spec);
  ~child_process();

  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;

  pid_t pid() const noexcept { return pid_; }

  /// Writes `line` and a newline to the child's stdin by `deadline`. Throws env_error:
  /// crashed (the child closed its stdin / exited) or timeout.
  void write_line(const std::string& line, std::chrono::steady_clock::time_point deadline);

  /// The next line of the child's stdout (without the newline) by `deadline`, or nothing at
  /// end of file. Throws env_error: timeout, or protocol when a line grows past `max_bytes`.
  std::optional<std::string> read_line(std::chrono::steady_clock::time_point deadline,
                                       std::size_t max_bytes);

  /// The last bytes the child wrote to stderr (at most `stderr_tail_bytes`), read so far and
  /// whatever can be read now without waiting.
  std::string stderr_tail();

  /// Waits up to `grace` for the child to exit by itself; then kills its process group and
  /// reaps it. Idempotent. Returns a description of how it ended ("exit code 3", "killed by
  /// signal 9").
  std::string terminate(std::chrono::milliseconds grace);

  /// True until the child is reaped.
  bool running() const noexcept { return pid_ > 0; }

  /// How many bytes of stderr are kept.
  static constexpr std::size_t stderr_tail_bytes = 8192;

private:
  void drain_stderr();
  void close_fds();

  pid_t pid_ = -1;
  int stdin_ = -1, stdout_ = -1, stderr_ = -1;
  std::string out_buffer_;
  std::string err_tail_;
  std::string ended_;
};

} // namespace rlforge::env
