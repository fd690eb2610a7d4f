#pragma once
// The --env job's engines as its threads share them: the episode threads sample on them, the
// trainer syncs weights to them and reads their activity. When a call finds them lost (their
// node died or hung) and --max-restarts allows, the first thread that sees it replaces them
// (engine_recovery.hpp) and gives them the policy's weights; threads whose calls failed
// meanwhile wait for it and try again. An episode in flight so resumes at the turn that failed:
// its earlier turns keep their tokens, log-probs and versions.
//
// Thread-safety: every member may be called from any thread; a replacement runs under the lock,
// so there is one per loss. Ownership: refers to the job's engine_recovery (and through it the
// engines' handle), which must outlive it.
#include <cstdint>
#include <mutex>
#include <string>

#include <caf/expected.hpp>
#include <nlohmann/json.hpp>

#include "actors/actor_group.hpp"
#include "actors/trainer_client.hpp"
#include "examples/grpo/engine_recovery.hpp"

namespace rlforge::examples::grpo {

class shared_engines {
public:
  /// `restarts_allowed` is --max-restarts (for the messages; the budget is `recovery`'s).
  shared_engines(engine_recovery& recovery, caf::actor_system& sys, int restarts_allowed);

  /// How many times the engines were replaced so far. Read it before a call to the engines and
  /// pass it to `recover` if the call fails.
  int64_t generation() const;

  /// A copy of the engines' handle as it is now.
  actors::actor_group group() const;

  /// The weight version the last replacement's sync gave the engines (0 before any).
  int64_t synced_version() const;

  /// After a call to the engines, started at generation `seen`, failed with `why`: true when
  /// the caller should try again (the engines were replaced since `seen`, by this call or
  /// another thread's); false when the engines were not lost (the failure is the call's own) or
  /// no restart is left. An error when the replacement or its weight sync failed; it says so.
  /// `client` is the calling thread's.
  caf::expected<bool> recover(actors::trainer_client& client, int64_t seen,
                              const std::string& why);

  /// The replacements since the last call, as the step's metrics record them (a JSON array).
  nlohmann::json take_recoveries();

private:
  mutable std::mutex mutex_;
  engine_recovery& recovery_;
  caf::actor_system& sys_;
  int restarts_allowed_;
  int64_t generation_ = 0;
  int64_t synced_version_ = 0;
  nlohmann::json recoveries_ = nlohmann::json::array();
};

} // namespace rlforge::examples::grpo
