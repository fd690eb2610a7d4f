#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "actors/actor_group.hpp"
#include "actors/tinker_groups.hpp"

/// How the Tinker backend (dispatcher_backend.hpp) heals after losing a rank: its node died or
/// hung (on a cluster), or its actor failed. Every group of the backend is on bundle 0 of one
/// placement, so a lost node loses all of them at once; the first call that sees it places the
/// placement again (on another node, waiting for room up to `recovery_timeout`) and starts a new
/// placement generation. Each model and engine is then rebuilt by its next call (a model from its
/// journal, tinker_journal.hpp; an engine from its weights), and the failed call is retried once.
namespace rlforge::actors {

/// One recovery: what saw the loss, where, and how long re-placing took.
struct tinker_recovery {
  std::string seen_by;   ///< the call that failed, e.g. "forward_backward(m)"
  std::string lost_node; ///< the lost group's node ("local" in the embedded default)
  std::string new_node;  ///< where the placement is now
  double seconds = 0;    ///< from the failed call's report to the new placement
  int64_t at_unix = 0;   ///< when the loss was seen
};

/// The restart budget and the re-placement. Thread-safe: `heal` is serialised, and a loss seen
/// by several calls at once (they all saw the same generation) is healed once; `recoveries`
/// answers at once, also while a heal waits for room.
class tinker_healing {
public:
  /// `groups` (and its options, which hold the budget, the timeout and the placement request)
  /// must outlive this.
  explicit tinker_healing(tinker_groups& groups);

  /// True when the options allow at least one restart.
  bool enabled() const;

  /// True when `g`'s rank or routing actor has terminated (asked by monitoring them: a
  /// terminated actor, a dead node's included, reports at once; a live one within 200 ms does
  /// not). A rank that is merely slow is not lost.
  bool lost(actor_group& g) const;

  /// Heals the loss `seen_by` saw in a group spawned under placement generation `generation`
  /// on `node`. Returns at once when a newer generation exists (another call healed it).
  /// Otherwise spends one restart and places the placement again; throws `tinker::request_error`
  /// (server) naming `seen_by` and every loss so far when the budget is spent or when no node
  /// has room within `recovery_timeout`.
  void heal(uint64_t generation, const std::string& node, const std::string& seen_by);

  /// The recoveries done so far, oldest first.
  std::vector<tinker_recovery> recoveries() const;

private:
  tinker_groups& groups_;
  std::mutex heal_mutex_; ///< serialises `heal` and guards the two below
  int used_ = 0;
  std::vector<std::string> losses_; ///< every loss seen, for the final error
  /// Guards `done_` alone, so that `recoveries` (a /metrics scrape) never waits for a heal.
  mutable std::mutex done_mutex_;
  std::vector<tinker_recovery> done_;
};

/// The node `g`'s rank 0 was placed on ("" when the group cannot say).
std::string node_of(actor_group& g);

} // namespace rlforge::actors
