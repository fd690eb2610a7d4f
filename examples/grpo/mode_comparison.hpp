#pragma once
// Compares GRPO runs of the RL loop's modes from their metrics (JSONL written by grpo.cpp):
// throughput, held-out accuracy against wall time, staleness and the engine/trainer log-prob
// gap. `grpo --compare SYNC.jsonl OTHER.jsonl ...` prints it; scripts/main runs it after an
// asynchronous run. Plain C++ on nlohmann-json; reentrant.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace rlforge::examples::grpo {

/// What one run measured.
struct run_summary {
  std::string mode;
  int64_t samples = 0;           ///< samples trained on
  double wall_seconds = 0;       ///< GRPO wall time (held-out evaluations left out)
  double samples_per_second = 0; ///< samples / wall_seconds
  /// (wall seconds, held-out accuracy) of every step that measured it, in step order.
  std::vector<std::pair<double, double>> accuracy;
  /// (wall seconds, mean reward of the last `reward_window` steps) at every step from the
  /// window's last on, in step order: how runs without a held-out set (environments' episodes)
  /// compare.
  std::vector<std::pair<double, double>> reward;
  std::vector<int64_t> staleness_counts; ///< rollouts trained on, by staleness
  double logprob_gap = 0;           ///< mean |engine − trainer| log-prob, sample-weighted
  double logprob_gap_corrected = 0; ///< the same after the truncated importance weights
  int64_t dropped = 0;
  int64_t requeued = 0;
  /// Where the time went, over the steps whose engine readings answered (-1 when none did):
  /// the engines' busy share (busy seconds / (ranks × step seconds)) and the trainer's share of
  /// step time spent waiting for rollouts; the mean tokens in flight on the engines when a step
  /// took its batch.
  double engine_busy_share = -1;
  double trainer_wait_share = 0;
  double tokens_in_flight = -1;
};

/// Steps the trailing mean of `run_summary::reward` takes.
inline constexpr int reward_window = 5;

/// Sums up the records of one run. Throws std::invalid_argument naming the step and field when
/// a record lacks `mode`, `samples`, `reward`, `wall_seconds`, `seconds`, `generate_seconds`,
/// `staleness_counts`, `logprob_gap`, `logprob_gap_corrected`, `dropped`, `requeued`,
/// `engine_ranks`, `engine_busy_seconds` or `tokens_in_flight` (the last three may be null:
/// not measured that step), or when there are no records.
run_summary summarize(const std::vector<nlohmann::json>& records);

/// Wall seconds at which `curve` (a run's `accuracy` or `reward`) first reached `target`;
/// negative when never.
double seconds_to_reach(const std::vector<std::pair<double, double>>& curve, double target);

/// The comparison table: each run's samples/s and its ratio to the first run (the baseline),
/// final accuracy, wall time, time to the baseline's final accuracy (for runs without held-out
/// accuracy: the final trailing mean reward and the time to the baseline's), staleness histogram,
/// log-prob gap (raw and corrected), dropped and requeued rollouts, and where the time went
/// (engines busy, trainer waiting, tokens in flight). Throws
/// std::invalid_argument for no runs.
std::string compare_runs(const std::vector<run_summary>& runs);

} // namespace rlforge::examples::grpo
