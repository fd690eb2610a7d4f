#pragma once
// The GRPO job's --env mode: GRPO on the multi-turn episodes of an environment program (any
// language, rlforge's JSON-lines protocol; docs/ENVIRONMENTS.md), sampled on the engines with the
// model's tokenizer and chat template. A failing environment fails its episode, not the job.
#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "../common/driver.hpp"
#include "actors/trainer_client.hpp"
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
};

/// Runs `opt.steps` GRPO steps: each resets `opt.prompts` tasks (a fresh seed each, `opt.env_task`)
/// `opt.group` times over in processes started from `opt.env_argv` (a pool of prompts x group,
/// reused across steps), plays the episodes in lockstep with turns sampled on the engines
/// (`opt.temperature`, a seed per turn, stopping on the chat template's end-of-turn token, at most
/// `opt.turn_tokens` tokens and the model's `context` in all), and updates the policy on the
/// episodes that did not fail: each episode's total reward on its last sampled token, only
/// sampled tokens in the loss, GRPO groups of the same task. Steps without a trainable episode
/// update nothing. Prints the failures of each step (one line per distinct error) and writes one
/// JSONL record per step with the episode counts. Fatal dispatcher errors exit via `or_die`.
env_job_result run_env_job(const fatal_errors& or_die, actors::trainer_client& client,
                           const options& opt, const prompt::chat_prompt& chat, int64_t context,
                           bool use_kl, std::ostream& metrics);

} // namespace rlforge::examples::grpo
