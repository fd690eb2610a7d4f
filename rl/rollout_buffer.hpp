#pragma once
// The bounded-staleness store of an RL loop's finished rollouts (owned by the rollout producer,
// rollout_producer.hpp). Plain data and logic on the runtime's wire types: no actors, no torch.
//
// Thread-safety: none; its owner (one actor) uses it from one thread at a time.
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "runtime/messages.hpp"

namespace rlforge::rl {

/// The oldest weight version among the tokens of `r`'s rows (a row without token versions counts
/// as version 0); -1 when `r` has no tokens at all.
int64_t oldest_version(const rollout& r);

/// How many versions behind `version` the oldest token of `r` is (0 when none is older; a
/// rollout without tokens is never stale).
int64_t staleness_of(const rollout& r, int64_t version);

/// Finished rollouts waiting for the trainer, in the order they finished, and the accounting of
/// what was taken and dropped.
class rollout_buffer {
public:
  /// Stores a finished rollout.
  void add(rollout r);

  /// Takes `count` rollouts (count >= 1) for a trainer at weight `version`: first every stored
  /// rollout staler than `max_staleness` (>= 0) is dropped and remembered (reported by the next
  /// successful take); then, when at least `count` remain, the `count` that finished first
  /// leave, ordered by id, with their staleness, and are added to the histogram. Otherwise
  /// nothing but the dropping happens and the result is empty.
  std::optional<rollout_batch> take(int64_t count, int64_t version, int64_t max_staleness);

  /// Counts a rollout submitted again (reported by the next take).
  void count_requeue() { ++requeued_since_take_; ++requeued_; }

  /// Rollouts stored now.
  size_t size() const { return done_.size(); }

  /// The stored rollouts and the accounting (`waiting` left empty for the caller to fill).
  rollout_state state() const;

  /// Replaces everything with `s` (its `waiting` part is the caller's).
  void restore(const rollout_state& s);

private:
  std::deque<rollout> done_;
  std::vector<int64_t> dropped_since_take_;
  int64_t requeued_since_take_ = 0;
  int64_t taken_ = 0;
  int64_t dropped_ = 0;
  int64_t requeued_ = 0;
  std::vector<int64_t> staleness_counts_;
};

} // namespace rlforge::rl
