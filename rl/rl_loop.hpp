#pragma once
// The reusable RL loop: a rollout producer over the engines (rollout_producer.hpp), its bounded
// buffer, and this driver-side trainer consumer that takes batches and moves new weights to the
// engines. The task (requests, rewards, the update itself) stays the caller's.
//
// Three modes, differing in how many batches of rollouts are generated ahead of the one being
// trained:
//  - sync: none. Batch k is generated on the weights trained on batch k-1, then trained on.
//  - one_step_off: one. Batch k+1 is generated while batch k trains (staleness <= 1 when the
//    engines keep up).
//  - fully_async: `max_staleness` batches (at least one). The engines generate continuously;
//    the trainer takes the first rollouts that finish, whichever batch they were asked for.
// In every mode a rollout staler than `max_staleness` versions when taken is dropped and counted
// (sync uses 0 since nothing can be older). Weight updates go to the engines without draining:
// pause "keep" (partial rollouts continue on the new weights, tokens tagged per version) or
// "abort" (partial rollouts are handed back and generated again).
//
// Thread-safety: one thread drives a loop (it blocks on the producer); the producer is an actor.
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/expected.hpp>
#include <nlohmann/json.hpp>

#include "actors/trainer_client.hpp"
#include "runtime/messages.hpp"

namespace rlforge::rl {

enum class rl_mode { sync, one_step_off, fully_async };

/// "sync", "one_step_off" or "fully_async".
const char* to_string(rl_mode m);

/// Parses a mode name; false for anything else.
bool parse_rl_mode(const std::string& text, rl_mode& out);

struct loop_options {
  rl_mode mode = rl_mode::sync;
  int64_t batch_rollouts = 1;          ///< rollouts (prompt groups) per training batch, >= 1
  int64_t max_staleness = 1;           ///< versions, >= 0 (sync trains with 0)
  std::string pause_mode = "keep";     ///< keep | abort (weight updates of separate engines)
  std::string policy_role = "policy";  ///< the role whose weights go to the engines
  std::string engine_role = "engines"; ///< the engines' role
  std::chrono::milliseconds take_timeout = std::chrono::minutes(10); ///< a batch's deadline
  int64_t max_submissions = 4;         ///< tries per rollout (producer_options)
};

/// "" when `o` is usable, else what is wrong, naming the field and value.
std::string check(const loop_options& o);

/// Batches generated ahead of the one being trained (see the modes above).
int64_t batches_ahead(const loop_options& o);

/// The staleness bound batches are taken with (0 in sync mode).
int64_t effective_max_staleness(const loop_options& o);

/// A training batch and what the loop measured for it.
struct loop_batch {
  std::vector<rollout> rollouts;  ///< ascending id
  std::vector<int64_t> staleness; ///< per rollout
  int64_t dropped = 0;            ///< rollouts dropped as too stale since the previous batch
  int64_t requeued = 0;           ///< rollouts submitted again since the previous batch
  double wait_seconds = 0;        ///< how long the trainer waited for it
};

/// The trainer side of the loop. Owns its producer actor (stopped by the destructor).
class rl_loop {
public:
  /// The request of rollout `id` (ids are 0, 1, 2, ... in the order they are asked for).
  using request_source = std::function<sample_request(int64_t id)>;

  /// Spawns the producer. `client` must outlive the loop. Throws std::invalid_argument with
  /// `check`'s message for bad options.
  rl_loop(caf::actor_system& sys, actors::trainer_client& client, loop_options options,
          request_source source);
  ~rl_loop();
  rl_loop(const rl_loop&) = delete;
  rl_loop& operator=(const rl_loop&) = delete;

  /// The engines' weight version the loop measures staleness against (set by `update_weights`,
  /// or by the caller after a sync it made itself).
  int64_t version() const { return version_; }
  void set_version(int64_t v) { version_ = v; }

  /// Tops the rollouts ahead up to what the mode keeps (asking `source` for new requests) and
  /// waits for the next batch. Errors (a refused request, no engine left alive, the deadline)
  /// name what was wrong; the loop stays usable.
  caf::expected<loop_batch> next_batch();

  /// Copies the policy's weights to the engines in the loop's pause mode; the new version.
  caf::expected<int64_t> update_weights();

  /// The rollouts held (waiting and finished) and the accounting, with the loop's own counters,
  /// as JSON for a checkpoint; `extra` (the caller's state, e.g. its random generator) is kept
  /// under "extra".
  caf::expected<nlohmann::json> snapshot(const nlohmann::json& extra = nlohmann::json::object());

  /// Loads `snapshot`'s rollouts into this loop's producer, which must hold nothing yet (a fresh
  /// loop), resubmits the waiting ones and restores the counters and version; returns "extra".
  /// The next `update_weights` continues the version numbering. Errors name what is wrong.
  caf::expected<nlohmann::json> restore(const nlohmann::json& snapshot);

  /// Staleness histogram of the rollouts taken so far (index = staleness), and the totals.
  struct totals {
    std::vector<int64_t> staleness_counts;
    int64_t taken = 0;
    int64_t dropped = 0;
    int64_t requeued = 0;
  };
  caf::expected<totals> accounting();

  const loop_options& options() const { return options_; }

private:
  caf::actor_system* sys_;
  actors::trainer_client* client_;
  loop_options options_;
  request_source source_;
  caf::actor producer_;
  int64_t next_id_ = 0;
  int64_t held_ = 0;    ///< rollouts given to the producer and not yet taken or dropped
  int64_t version_ = 0;
  bool restored_version_ = false; ///< the next update must not go below version_
};

} // namespace rlforge::rl
