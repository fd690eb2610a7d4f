#pragma once
// What the GRPO example shows and writes: the one-line progress bar, the JSONL metrics records
// and the PNG plot of the reward curve drawn by the `gnuplot` program. Plain C++ (no torch, no
// CAF), so it is tested on its own.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace rlforge::examples::report {

/// What one GRPO step measured.
struct step_stats {
  int step = 0;                  ///< 1-based
  int total_steps = 0;           ///< >= step
  double reward = 0;             ///< mean reward of the step's samples
  double accuracy = 0;           ///< share of the step's samples with reward 1
  double loss = 0;               ///< policy loss (masked sum, token-mean scaled; epoch mean)
  double kl = 0;                 ///< mean KL to the reference policy (epoch mean)
  double entropy = 0;            ///< mean entropy of the sampled tokens (epoch mean)
  double grad_norm = 0;          ///< largest pre-clip gradient norm of the step's updates
  int64_t tokens = 0;            ///< response tokens generated
  double generate_seconds = 0;   ///< sampling on the engines
  double train_seconds = 0;      ///< ref forward, policy forward_backward and optim_step
  double sync_seconds = 0;       ///< weight sync to the engines
  int64_t weight_version = 0;    ///< the engines' weight version after the sync

  /// Wall seconds of the step (generate + train + sync).
  double seconds() const { return generate_seconds + train_seconds + sync_seconds; }
  /// Generated tokens per second of generation time (0 when no time was measured).
  double tokens_per_second() const;
};

/// Throws std::invalid_argument naming the field and value when `s` is not a record of a step:
/// step < 1, total_steps < step, a negative token count or time, a non-finite number.
void validate(const step_stats& s);

/// The progress line of `s`, e.g.
/// `step  12/60 [####------] reward 0.430 loss 0.0120 kl 0.0021 tok/s 1234 | gen 1.20s train
/// 0.80s sync 0.10s` (no newline; the caller prints it after '\r'). `bar_width` >= 1. Throws as
/// `validate` and for a bar width < 1.
std::string progress_line(const step_stats& s, int bar_width = 20);

/// The JSONL record of `s`: one object with every field plus `tokens_per_second` and
/// `seconds`. Throws as `validate`.
nlohmann::json to_json(const step_stats& s);

/// Adds one to `histogram[staleness]` (a histogram of rollouts or groups by staleness: index =
/// versions behind), growing it with zeros as needed. Throws std::invalid_argument for a
/// negative staleness.
void count_staleness(std::vector<int64_t>& histogram, int64_t staleness);

/// Reads a JSONL file written with `to_json(...).dump()` lines and checks each record: an
/// object holding the numeric fields `step`, `reward`, `loss`, `kl`, `tokens_per_second`,
/// `generate_seconds`, `train_seconds` and `sync_seconds`. Throws std::runtime_error naming the
/// file (and the line number) when it cannot be read, a line is not JSON or misses a field.
std::vector<nlohmann::json> read_metrics(const std::string& path);

/// Where the plotting program is: `candidate` when it contains a '/' and names an executable
/// file, else the first executable `candidate` in the directories of $PATH; nullopt when none.
std::optional<std::string> find_program(const std::string& candidate = "gnuplot");

/// What `plot_reward_curve` should draw.
struct plot_spec {
  std::vector<double> rewards;  ///< mean reward per step (step i+1 = rewards[i]), non-empty
  int smoothing = 10;           ///< window of the running mean drawn over it, >= 1
  std::string title = "GRPO: mean reward per step";
  std::string png_path;         ///< the PNG to write (replaced when it exists)
};

/// The gnuplot script `plot_reward_curve` runs for `spec` (pngcairo terminal, data inline).
/// Throws std::invalid_argument for an empty reward list, a non-finite reward (naming its step),
/// a smoothing window < 1, an empty output path, or a path or title holding a newline.
std::string plot_script(const plot_spec& spec);

/// Outcome of `plot_reward_curve`.
struct plot_result {
  bool written = false;  ///< the PNG exists and starts with the PNG signature
  std::string message;   ///< why not (program missing, its error output), empty on success
};

/// Draws the reward curve into `spec.png_path` by running `gnuplot` (found with `find_program`,
/// or `program` when given) on `plot_script(spec)`. Never throws for a missing or failing
/// gnuplot: the result says what happened ("gnuplot not found on PATH; install gnuplot-nox ...",
/// or gnuplot's exit status and error output). Throws std::invalid_argument as `plot_script`.
plot_result plot_reward_curve(const plot_spec& spec, const std::string& program = "gnuplot");

/// One run's held-out accuracy against wall time, for `accuracy_plot_script`.
struct accuracy_curve {
  std::string label;                            ///< the key entry, e.g. the mode
  std::vector<std::pair<double, double>> points; ///< (wall seconds, accuracy in [0, 1])
};

/// The gnuplot script drawing `curves` (accuracy against wall seconds, one line each) into
/// `png_path`. Throws std::invalid_argument for no curves, a curve without points, a
/// non-finite value, an empty path, or a path, title or label holding a line break.
std::string accuracy_plot_script(const std::vector<accuracy_curve>& curves,
                                 const std::string& png_path, const std::string& title);

/// Runs `gnuplot` (found with `find_program`, or `program`) on `script`, which writes the PNG
/// `png_path`; never throws: the result says what happened (as `plot_reward_curve`).
plot_result run_gnuplot(const std::string& script, const std::string& png_path,
                        const std::string& program = "gnuplot");

/// True when `path` is a readable file starting with the 8-byte PNG signature.
bool is_png(const std::string& path);

} // namespace rlforge::examples::report
