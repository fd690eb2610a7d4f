#pragma once
// The GRPO job's engines, replaced in place when they are lost (--max-restarts): their node
// died or hung. New engines are placed in a fresh "generation" placement group (waiting up to
// --recovery-timeout for room: a node left, or one that joins), get the model and are
// registered with the dispatcher under the same role; the job then gives them the policy's
// weights and the rollouts that were lost (grpo.cpp: rl_loop snapshot and restore). The trainer
// keeps its ranks and its state: nothing is rolled back.
//
// Used from one thread at a time (the task job's main thread; the --env job's threads through
// shared_engines.hpp, under its lock). Owns nothing: the engines' handle is the job's
// (`engines`, updated on a replacement), the restart count the job's (shared with the trainer's
// recovery, trainer_recovery.hpp).
#include <chrono>
#include <string>

#include <caf/actor.hpp>
#include <caf/expected.hpp>

#include "actors/actor_group.hpp"
#include "actors/placement_manager.hpp"
#include "actors/trainer_client.hpp"
#include "examples/grpo/options.hpp"
#include "examples/grpo/group_replacement.hpp"

namespace rlforge::examples {
struct fatal_errors;
}

namespace rlforge::examples::grpo {

class engine_recovery {
public:
  /// `engines` is the job's handle to its engine group (placed as `split_layout` says, role
  /// "engines"); `model` what they are initialized with before the weight sync.
  engine_recovery(const fatal_errors& or_die, actors::placement_client& pgs, caf::actor manager,
                  actors::actor_group& engines, model_spec model, const options& opt,
                  restart_budget& budget);

  /// The job's restarts (--max-restarts), shared by both recoveries.
  const restart_budget& budget() const { return budget_; }

  /// The engines now (the job's handle; `replace` points it at the new group).
  actors::actor_group& group() const { return engines_; }

  /// True when the engines no longer answer: their ranks died or their node was declared dead
  /// (a call to them fails at once then; a live engine answers within `patience`).
  bool engines_lost(std::chrono::milliseconds patience = std::chrono::seconds(10));

  /// Replaces the engines: stops the old group, removes its placement group, places a new one
  /// and spawns the engines there (placing again when the spawn fails, e.g. on the lost node
  /// before the head declared it dead), all within the recovery timeout; then registers and
  /// initializes them through `client` (the calling thread's). Returns the node they are on,
  /// or an error naming what failed (the timeout's names the last attempt). Spends a restart of
  /// the budget either way.
  caf::expected<std::string> replace(actors::trainer_client& client);

private:
  const fatal_errors& or_die_;
  actors::placement_client& pgs_;
  caf::actor manager_;
  actors::actor_group& engines_;
  model_spec model_;
  double timeout_s_;
  restart_budget& budget_;
};

} // namespace rlforge::examples::grpo
