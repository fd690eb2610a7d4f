#pragma once
// The GRPO job's trainer, replaced in place when it is lost (--max-restarts, placement split):
// the node holding the policy and the reference model died or hung. Both groups are placed
// again in a fresh "training" placement group (waiting up to --recovery-timeout for room),
// registered with the dispatcher under their roles and restored from the last committed
// checkpoint: the policy with its optimizer, the reference from the model written next to the
// checkpoints. The job then rolls its own state back to that checkpoint (task_job.cpp: the RL
// loop's rollouts, its generator, its metrics) and replays the steps after it from the same
// data. The engines keep running; they get the restored policy's weights by a sync.
//
// Used from the driver's main thread only. Owns nothing: the groups' handles are the job's
// (`policy`, `ref`, updated on a replacement), the restart count the job's (shared with the
// engines' recovery).
#include <chrono>
#include <cstdint>
#include <string>

#include <caf/actor.hpp>
#include <caf/expected.hpp>

#include "actors/actor_group.hpp"
#include "actors/placement_manager.hpp"
#include "actors/trainer_client.hpp"
#include "examples/grpo/group_replacement.hpp"
#include "examples/grpo/options.hpp"

namespace rlforge::examples {
struct fatal_errors;
}

namespace rlforge::examples::grpo {

/// The reference model's directory next to the checkpoints (written once, when the reference is
/// made from the warm-started policy; read by --resume and by a trainer recovery).
std::string ref_model_dir(const options& opt);

/// `base` (its numerics: compute dtype, batch invariance) with its weights from model
/// directory `dir` instead.
model_spec from_directory(model_spec base, const std::string& dir);

class trainer_recovery {
public:
  /// `policy` and `ref` are the job's handles to its trainer groups (placed as `split_layout`
  /// says); `model` is what the policy is initialized with before the checkpoint loads, the
  /// reference coming from `ref_model_dir`.
  trainer_recovery(const fatal_errors& or_die, actors::trainer_client& client,
                   actors::placement_client& pgs, caf::actor manager, actors::actor_group& policy,
                   actors::actor_group& ref, model_spec model, const options& opt,
                   restart_budget& budget);

  /// The job's restarts (--max-restarts), shared by both recoveries.
  const restart_budget& budget() const { return budget_; }

  /// True when the policy or the reference no longer answers: a rank died or its node was
  /// declared dead (a call fails at once then; a live rank answers within `patience`, after the
  /// call it is in).
  bool trainer_lost(std::chrono::milliseconds patience = std::chrono::seconds(30));

  /// What a replacement did.
  struct replaced {
    std::string node;  ///< where the trainer is now
    int64_t step = 0;  ///< the checkpoint the policy was restored from
  };

  /// Replaces the trainer: stops both groups, places and spawns them again (group_replacement),
  /// registers them, initializes the policy with the job's model and the reference from
  /// `ref_model_dir`, loads the latest committed checkpoint into the policy and sets
  /// the job's training settings on both (`configure_training`). An error names what failed (no committed checkpoint: the job cannot roll
  /// back, and says --checkpoint-every). Spends a restart of the budget either way.
  caf::expected<replaced> replace();

private:
  const fatal_errors& or_die_;
  actors::trainer_client& client_;
  actors::placement_client& pgs_;
  caf::actor manager_;
  actors::actor_group& policy_;
  actors::actor_group& ref_;
  model_spec model_;
  const options& opt_;
  restart_budget& budget_;
};

} // namespace rlforge::examples::grpo
