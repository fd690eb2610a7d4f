#pragma once
// A child process for the multi-process cluster tests: started with fork/exec, its stdout and
// stderr in a log file, killed (SIGKILL, by its pid) when the object goes away and also when the
// test process dies (PR_SET_PDEATHSIG), so no test leaves a process behind.
#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace rlforge::cluster_test {

class child_process {
public:
  /// Starts `argv` (argv[0] a path, or a name looked up in PATH) with `env` added to this
  /// process's environment; output goes to `log_path`. Throws std::runtime_error when fork fails.
  child_process(std::vector<std::string> argv, std::string log_path,
                std::map<std::string, std::string> env = {});
  ~child_process();
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;

  pid_t pid() const { return pid_; }

  /// The log so far.
  std::string log() const;

  /// Waits until the log contains `needle` (true), the process exits or `timeout` passes
  /// (false).
  bool wait_for_log(const std::string& needle, std::chrono::milliseconds timeout);

  /// Sends `sig` to the process.
  void signal(int sig);

  /// Waits up to `timeout` for the process to exit; its exit status, or -1 when it was killed by
  /// a signal, or nullopt when it is still running.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout);

  /// Kills (SIGKILL) and reaps the process. Idempotent.
  void kill();

  /// True while the process has not exited.
  bool running();

private:
  /// Records how a reaped process ended.
  void reaped(int status);

  pid_t pid_ = -1;
  bool reaped_ = false;
  int exit_code_ = -1; ///< once reaped: its exit status, -1 when a signal ended it
  std::string log_path_;
};

/// The text after `prefix` up to the next whitespace, in `text` (empty when absent).
std::string word_after(const std::string& text, const std::string& prefix);

} // namespace rlforge::cluster_test
