#include "runtime/stop_signals.hpp"

#include <pthread.h>

#include <ctime>
#include <utility>

namespace rlforge::runtime {

sigset_t block_stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

stop_watcher::stop_watcher(sigset_t set, std::function<void(int)> on_signal)
    : set_(set), on_signal_(std::move(on_signal)) {
  thread_ = std::thread([this] {
    timespec tick{0, 100 * 1000 * 1000};
    while (!done_.load()) {
      if (int sig = sigtimedwait(&set_, nullptr, &tick); sig > 0) {
        signal.store(sig);
        stop.store(true);
        if (on_signal_)
          on_signal_(sig);
        return;
      }
    }
  });
}

stop_watcher::~stop_watcher() {
  done_.store(true);
  thread_.join();
}

} // namespace rlforge::runtime
