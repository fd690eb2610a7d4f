#pragma once
// SIGINT and SIGTERM as requests to stop: blocked in every thread (so no thread dies of them),
// then taken by one thread that waits for them (`stop_watcher`). The CLI's long-running
// commands and the example drivers stop cleanly this way.
#include <atomic>
#include <csignal>
#include <functional>
#include <thread>

namespace rlforge::runtime {

/// Blocks SIGINT and SIGTERM in the calling thread and in every thread it starts from now on
/// (call before creating an actor system), and returns the set, so one thread can wait for them
/// with `sigwait` and stop the program cleanly.
sigset_t block_stop_signals();

/// Waits on a thread of its own for a signal of `set` (blocked with `block_stop_signals`): sets
/// `stop` and calls `on_signal` (on that thread) with the signal's number, once. The destructor
/// ends the thread (within 0.1 s). `stop` may be read from any thread.
class stop_watcher {
public:
  explicit stop_watcher(sigset_t set, std::function<void(int)> on_signal = {});
  ~stop_watcher();
  stop_watcher(const stop_watcher&) = delete;
  stop_watcher& operator=(const stop_watcher&) = delete;

  std::atomic<bool> stop{false};
  /// The signal received (0 while none was).
  std::atomic<int> signal{0};

private:
  sigset_t set_;
  std::function<void(int)> on_signal_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

} // namespace rlforge::runtime
