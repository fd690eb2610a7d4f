#pragma once
// Command-line options of the GRPO main job (grpo.cpp). Plain C++, tested on its own.
#include <cstdint>
#include <string>
#include <vector>

namespace rlforge::examples::grpo {

/// Every setting of the job. The defaults are the tuned full run of the arithmetic task (a few
/// minutes on 2 cores); `--task sort`, `--task count` and `--env` switch to their own defaults and
/// `--quick` to a small run for the ctest entries, all before the other flags apply.
struct options {
  // The job.
  int steps = 150;                ///< GRPO steps (--steps)
  uint64_t seed = 1;              ///< model init, task split, sampling (--seed)
  std::string metrics = "grpo_metrics.jsonl"; ///< JSONL, one record per step (--metrics)
  std::string plot = "grpo_reward.png";       ///< reward curve PNG (--plot)
  bool quiet = false;             ///< no progress bar (--quiet)
  bool quick = false;             ///< small end-to-end run (--quick)
  // The task: a built-in one (--task), or an environment's episodes (--env, below).
  std::string task = "arith";     ///< arith (multi-digit addition), sort or count (--task)
  int digits = 2;                 ///< operand digits (--digits; arith)
  int min_numbers = 12;           ///< shortest list, fewest counted (--min-numbers; sort, count)
  int max_numbers = 80;           ///< longest list, most counted (--max-numbers; sort, count)
  int held_out = 200;             ///< held-out problems (--held-out)
  /// A full run fails unless held-out accuracy rises by the job's goal (+20 points); with
  /// --no-goal it reports the accuracy without judging it. Tests compare two runs of the job
  /// (one node against a cluster) rather than assert what it learns, which depends on the
  /// CPU's kernels and the compute dtype.
  bool accuracy_goal = true;
  // Warm start (supervised).
  int sft_steps = 3000;           ///< most warm-start steps (--sft-steps; 0 = none)
  /// Stop the warm start once greedy accuracy on a validation sample of training problems
  /// reaches this share (--sft-target, in [0, 1]; 0 = always run --sft-steps steps).
  double sft_target = 0.3;
  int sft_batch = 64;             ///< (--sft-batch)
  double sft_lr = 4e-3;           ///< (--sft-lr)
  // GRPO.
  int prompts = 64;               ///< prompts per step (--prompts)
  int group = 8;                  ///< samples per prompt (--group), >= 2
  double lr = 1e-3;               ///< initial policy learning rate, cosine-decayed to lr/10 (--lr)
  int epochs = 2;                 ///< PPO-clip updates on each step's samples (--epochs)
  /// Padding-free micro-batches of the policy and ref passes: rows sorted by length, packed into
  /// passes of at most this many tokens each trimmed to its longest row (--micro-batch-tokens;
  /// 0 = the whole batch in one pass padded to its longest row).
  int micro_batch_tokens = 0;
  double temperature = 0.7;       ///< sampling temperature (--temperature), > 0
  double kl_coef = 0.001;         ///< KL-to-reference loss coefficient (--kl-coef; 0 = off)
  // Where the job runs.
  std::string cluster;            ///< HOST:PORT of a cluster head (--cluster; empty = embedded)
  std::string tls;                ///< the cluster's TLS directory (--tls)
  std::string log_level;          ///< --log-level (empty: the default, or SPDLOG_LEVEL)
  /// "colocated" (--placement; default): policy, ref and engines share both GPUs at 0.2 each
  /// and take turns (SkyRL's colocate_all). "split": two placement groups of one bundle each,
  /// the policy (1 rank) and the ref (1 rank) in the first at 0.5 GPU each, the engines (1 rank)
  /// in the second; one thread each, nothing is offloaded, and weight sync goes from one
  /// group's node to the other's.
  std::string placement = "colocated";
  // The RL loop (rl/rl_loop.hpp).
  std::string mode = "sync";      ///< sync | one_step_off | fully_async (--mode; async: split)
  int max_staleness = 1;          ///< versions a trained rollout may lag (--max-staleness, >= 0)
  std::string log_format;                ///< --log-format (empty: text)
  std::string weight_transport = "auto"; ///< (--weight-transport)
  bool delta_sync = false;                ///< (--delta-sync)
  /// Precision of the matrix products of every role (--compute-dtype): fp32, bf16, or "" = each
  /// rank's node default (bf16 where the CPU has fast bf16 GEMMs).
  std::string compute_dtype;
  /// Batch-invariant numerics in every role (--batch-invariant): a token's log-prob does not
  /// depend on its batch-mates, so a replayed step gives the original's bits.
  bool batch_invariant = false;
  std::string pause = "keep";     ///< what weight updates do to partial rollouts (--pause)
  /// Off-policy correction with the engines' log-probs (--tis): none, token or sequence
  /// truncated importance sampling. Default: none in sync mode, token otherwise.
  std::string tis;
  int eval_every = 0;             ///< held-out accuracy every N steps (--eval-every; 0 = ends)
  /// Checkpoints: the policy and ref states, the RL loop's rollouts (waiting and finished) and
  /// the job's own state every --checkpoint-every steps into --checkpoint-dir; --resume goes on
  /// from the latest one there.
  std::string checkpoint_dir;
  int checkpoint_every = 0;       ///< (--checkpoint-every; 0 = never)
  bool resume = false;            ///< (--resume)
  /// Losses of a node the job recovers from in place (--max-restarts; needs --placement split;
  /// 0 = a loss ends the job). Lost engines: new ones are placed, synced, and given the rollouts
  /// that were lost; nothing is rolled back. A lost trainer (policy and ref): both are placed
  /// again and restored from the last checkpoint (needs --checkpoint-every), and the job rolls
  /// back to it and replays the steps after it.
  int max_restarts = 0;
  double recovery_timeout = 60;   ///< seconds a recovery waits for room (--recovery-timeout)
  // An environment instead of a built-in task (--env CMD).
  std::string env_command;        ///< as given (--env); empty = a built-in task
  std::vector<std::string> env_argv; ///< `env_command` split into words (see `split_command`)
  std::string model;              ///< model directory with a tokenizer (--model; --env only)
  std::string env_task = "{}";    ///< JSON object sent with every reset (--env-task)
  int max_turns = 5;              ///< turns before the driver stops an episode (--max-turns)
  int turn_tokens = 24;           ///< most tokens the model samples per turn (--turn-tokens)
  double env_timeout = 30;        ///< seconds an environment may take per call (--env-timeout)
  /// The run fails unless the mean reward of its last five steps reaches this
  /// (--min-final-reward, >= 0; negative = no goal).
  double min_final_reward = -1;
};

/// Most environments (--prompts x --group, one process each) an --env run keeps at once.
inline constexpr int max_environments = 256;

/// Splits a command line into words at unquoted whitespace: '...' and "..." quote literally,
/// a backslash outside quotes takes the next character literally. No other shell syntax.
/// Returns false with `error` set for an unterminated quote, a trailing backslash or no words at
/// all.
bool split_command(const std::string& command, std::vector<std::string>& words,
                   std::string& error);

/// The result of parsing: the options, or an error naming the flag and value.
struct parse_result {
  options opts;
  std::string error;   ///< empty on success
  bool help = false;   ///< --help was given
};

/// Parses `args` (without the program name) with CLI11, from the one list of flags that `usage`
/// documents. Unknown flags and missing values get CLI11's message naming them; values that are not
/// numbers or are out of range (steps, sft-batch, prompts, held-out, epochs, max-turns,
/// turn-tokens >= 1; sft-steps >= 0; group >= 2; digits 1..4; learning rates, temperature and
/// env-timeout > 0 and finite; kl-coef >= 0; sft-target in [0, 1]; max-staleness in 0..1000;
/// eval-every >= 0; min-numbers 2..100, max-numbers min-numbers..100; --task, --placement, --mode,
/// --pause and --tis one of their words) give an error
/// naming the flag and the value; an asynchronous --mode without --placement split or with --env
/// is refused, and so are --checkpoint-every or --resume without --checkpoint-dir; empty --metrics
/// / --plot / --cluster / --tls values are refused too. With --env: --model is required, --env-task
/// must be a JSON object,
/// --prompts x --group at most `max_environments`, and the flags of the built-in tasks (--task,
/// --digits, --held-out, --sft-*, --no-goal, ...) are refused; without it the environment flags
/// (--model, --env-task, --max-turns, --turn-tokens, --env-timeout, --min-final-reward) are
/// refused. A task's own flags (--digits: arith; --min-numbers, --max-numbers: sort and count) are
/// refused with the other tasks.
parse_result parse_options(const std::vector<std::string>& args);

/// The help: a usage line, what the job does, then each flag with its value, meaning and the
/// default of the mode `args` select (--quick, --env change them), and examples.
std::string usage(const std::string& prog, const std::vector<std::string>& args = {});

} // namespace rlforge::examples::grpo
