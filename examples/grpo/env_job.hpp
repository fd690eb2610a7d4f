#pragma once
// The GRPO job's --env mode: GRPO on the multi-turn episodes of an environment program (any
// language, rlforge's JSON-lines protocol; docs/ENVIRONMENTS.md), sampled on the engines with the
// model's tokenizer and chat template, in any of the RL loop's modes. A failing environment
// fails its episode, not the job.
#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "../common/driver.hpp"
#include "actors/actor_group.hpp"
#include "actors/trainer_client.hpp"
#include "examples/grpo/engine_recovery.hpp"
#include "examples/grpo/options.hpp"
#include "prompt/chat_prompt.hpp"

namespace rlforge::examples::grpo {

/// What the --env steps did.
struct env_job_result {
  std::vector<double> rewards;           ///< per step: mean total reward of its episodes that ran
  int64_t episodes = 0;                  ///< episodes in all
  int64_t done = 0;                      ///< ended by the environment
  int64_t stopped = 0;                   ///< ended by the driver (turn limit, context full)
  int64_t failed = 0;                    ///< failed (not trained on)
  std::map<std::string, int64_t> errors; ///< distinct failures (first line) and their counts
  int64_t trained = 0;                   ///< episodes trained on
  double grpo_seconds = 0;               ///< wall time of the steps
  std::vector<int64_t> staleness_counts; ///< groups trained on, by staleness
  int64_t dropped = 0;                   ///< groups dropped as too stale
  int64_t resampled = 0;                 ///< turns sampled again (an engine lost, pause abort)
};

/// Runs `opt.steps` GRPO steps in `opt.mode` (sync, one_step_off, fully_async: rl/rl_loop.hpp).
/// Each step trains on `opt.prompts` GRPO groups: a task (`opt.env_task`, a fresh seed each)
/// reset `opt.group` times in processes started from `opt.env_argv`, its episodes stepped in
/// lockstep with turns sampled on the engines (`opt.temperature`, seeds drawn from the group's
/// seed, stopping on the chat template's end-of-turn token, at most `opt.turn_tokens` tokens and
/// the model's `context` in all). The groups run on worker threads of an episode_producer
/// (episode_producer.hpp): in sync mode a step's groups, in the asynchronous modes as many more
/// as the mode keeps ahead, while the policy trains. A turn the engines fail or hand back
/// (`--pause abort`) is sampled again, up to 4 times. Engines lost for good (their node died or
/// hung) are replaced when `opt.max_restarts` allows (shared_engines.hpp): the episodes in
/// flight wait and resume at the turn that failed, and the step's record lists the recovery. The policy is updated on the
/// episodes that did not fail: each episode's total reward on its last sampled token, only
/// sampled tokens in the loss, GRPO groups of the same task, and in the asynchronous modes the
/// engines' log-prob of each sampled token for the off-policy correction (--tis). Steps without a
/// trainable episode update nothing. Prints the failures of each step (one line per distinct
/// error) and writes one JSONL record per step with the episode counts, the staleness and where
/// the time went (`engines`' readings, engine_reading.hpp). With `opt.checkpoint_every` a
/// checkpoint in `opt.checkpoint_dir` every so many steps holds the policy and the groups held
/// (finished ones with their episodes, unfinished ones as their resets: episode_json.hpp);
/// `opt.resume` goes on from the latest one, running the unfinished groups again from their
/// start, so no episode is lost or trained on twice. Fatal dispatcher errors, a group whose
/// turns failed for good and an unreadable checkpoint exit via `or_die`.
env_job_result run_env_job(const fatal_errors& or_die, actors::trainer_client& client,
                           engine_recovery& engines, const options& opt,
                           const prompt::chat_prompt& chat, int64_t context, bool use_kl,
                           std::ostream& metrics);

} // namespace rlforge::examples::grpo
