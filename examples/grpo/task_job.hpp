#pragma once
// The GRPO job on a built-in task (--task: arith, the main job, or sort): a supervised warm
// start, held-out greedy accuracy, the GRPO steps through an `rl_loop` in the mode --mode names,
// held-out accuracy again. Engines lost on the way are replaced (engine_recovery.hpp); a lost trainer is replaced
// and the job rolls back to the last checkpoint and replays the steps after it
// (trainer_recovery.hpp).
#include <cstdint>
#include <ostream>
#include <vector>

#include "../common/driver.hpp"
#include "actors/trainer_client.hpp"
#include "examples/grpo/engine_recovery.hpp"
#include "examples/grpo/options.hpp"
#include "examples/grpo/trainer_recovery.hpp"
#include "examples/grpo/verifiable_task.hpp"

namespace rlforge::examples::grpo {

/// What a task's GRPO steps measured.
struct task_result {
  std::vector<double> rewards; ///< mean reward per step
  double acc_before = 0;       ///< held-out greedy accuracy after the warm start
  double acc_after = 0;        ///< ... and after GRPO
  int64_t first_version = 0;   ///< the engines' weight version when GRPO starts
  double grpo_seconds = 0;     ///< wall time of the GRPO steps (evaluations left out)
  int64_t samples = 0;         ///< samples trained on
  std::vector<int64_t> staleness_counts; ///< rollouts trained on, by staleness
  int64_t dropped = 0;         ///< rollouts dropped as too stale
  int64_t requeued = 0;        ///< rollout submissions repeated (abort, lost engine)
};

/// A task's job: warm start, held-out accuracy, GRPO steps, held-out accuracy again.
/// `model` is the policy's (its numerics are the reference's too). While --max-restarts
/// allows, lost engines are replaced through `engines`, and a trainer lost during the GRPO
/// steps through `trainer`: the job then goes back to the last checkpoint (the loop's
/// rollouts, the generator, the figures; `metrics`, the file --metrics names, is cut back to
/// the checkpoint's step) and replays the steps after it. A loss during the warm start ends
/// the job.
task_result run_task(const examples::fatal_errors& or_die, actors::trainer_client& client,
                     const examples::grpo::options& opt, const verifiable_task& task,
                     const model_spec& model, examples::grpo::engine_recovery& engines,
                     examples::grpo::trainer_recovery& trainer, std::ostream& metrics);

} // namespace rlforge::examples::grpo
