#include "cli/signals.hpp"

#include <pthread.h>

namespace rlforge::cli {

sigset_t block_stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

} // namespace rlforge::cli
