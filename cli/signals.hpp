#pragma once

#include <csignal>

namespace rlforge::cli {

/// Blocks SIGINT and SIGTERM in the calling thread and in every thread it starts from now on
/// (call before creating an actor system), and returns the set, so one thread can wait for them
/// with `sigwait` and stop the program cleanly.
sigset_t block_stop_signals();

} // namespace rlforge::cli
