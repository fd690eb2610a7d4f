#pragma once
// One GRPO update of the policy through the dispatcher, shared by the job's two kinds of task (the
// built-in tasks and --env): advantages, old and reference log-probs, PPO-clip updates, then
// the weight sync to the engines, the metrics record and the progress line.
#include <cstdint>
#include <ostream>
#include <vector>

#include "../common/driver.hpp"
#include "actors/trainer_client.hpp"
#include "backends/train/optimizer.hpp"
#include "backends/train/training_batch.hpp"
#include "examples/grpo/options.hpp"
#include "examples/grpo/report.hpp"
#include "examples/grpo/training_settings.hpp"

namespace rlforge::examples::grpo {

/// The samples of one step: row i is prompts[i] + responses[i] from prompt group group_ids[i];
/// `per_token` holds its "rewards" (the outcome on the last trained token), when not every
/// response token is the model's its "loss_mask", and with an off-policy correction the
/// engines' "rollout_logprobs".
struct grpo_rows {
  std::vector<std::vector<int64_t>> prompts;
  std::vector<std::vector<int64_t>> responses;
  backends::per_token_values per_token;
  std::vector<int64_t> group_ids;
};

/// Gives the policy and the reference model `training_config(opt)` (the first error ends it).
caf::expected<void> configure_training(actors::trainer_client& client, const options& opt);

/// How far the engines' log-probs were from the trainer's, over the response tokens of a step
/// that had "rollout_logprobs" (else all 0).
struct logprob_gap {
  double raw = 0;       ///< mean |engine − trainer| log-prob
  /// Mean |engine + log w − trainer| with w the truncated importance weight of --tis token
  /// (min(ρ, cap), ρ = exp(trainer − engine)): what is left once the correction applies.
  double corrected = 0;
  double tis_clipped = 0; ///< the loss's share of tokens whose weight was clipped (--tis)
};

/// GRPO advantages (group-normalised, token-mean scaled), the policy's log-probs before the
/// update ("old"), the reference's for the KL loss when `use_kl`, then `opt.epochs` PPO-clip
/// updates at `adam`, with `opt.tis` truncated importance sampling against the rows'
/// "rollout_logprobs" when they have them. Adds loss, kl, entropy, grad_norm and train_seconds
/// to `st`; returns the log-prob gap. Fatal dispatcher errors exit through `or_die`.
logprob_gap update_policy(const fatal_errors& or_die, actors::trainer_client& client,
                          const grpo_rows& rows, const backends::adam_params& adam, bool use_kl,
                          const options& opt, report::step_stats& st);

/// Appends the step's JSONL record — the members of `extra` added to `report::to_json(st)` —
/// and prints the progress line unless quiet. The caller has synced the weights (`st`'s
/// sync_seconds and weight_version).
void finish_step(const options& opt, const report::step_stats& st, std::ostream& metrics,
                 const nlohmann::json& extra = nlohmann::json::object());

} // namespace rlforge::examples::grpo
