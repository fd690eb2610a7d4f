#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

// Torch-free: a schedule is arithmetic on step counts.

namespace rlforge::backends {

/// The shape of a learning-rate schedule (names as Hugging Face's `get_scheduler`).
enum class lr_schedule_kind {
  constant,             ///< base_lr at every step
  constant_with_warmup, ///< linear from 0 over warmup_steps, then base_lr
  cosine,               ///< linear warmup, then half a cosine down to min_lr_ratio·base_lr
};

/// "constant", "constant_with_warmup" or "cosine".
const char* to_string(lr_schedule_kind x) noexcept;

/// Inverse of `to_string` (also accepts "linear_warmup" for `constant_with_warmup`); throws
/// `error{invalid_argument}` listing the valid names.
lr_schedule_kind parse_lr_schedule_kind(const std::string& name);

/// What a schedule computes from.
struct lr_schedule_config {
  lr_schedule_kind kind = lr_schedule_kind::constant;
  double base_lr = 1e-4;
  int64_t warmup_steps = 0;
  /// Steps over which the cosine decays (counting the warmup); cosine only.
  int64_t total_steps = 0;
  /// The cosine ends at `min_lr_ratio * base_lr`; cosine only.
  double min_lr_ratio = 0.0;

  /// Throws `error{invalid_argument}` naming the field and value for: base_lr negative or not
  /// finite, warmup_steps < 0, min_lr_ratio outside [0, 1], and for cosine total_steps < 1 or
  /// warmup_steps > total_steps.
  void validate() const;
};

bool operator==(const lr_schedule_config& a, const lr_schedule_config& b);
inline bool operator!=(const lr_schedule_config& a, const lr_schedule_config& b) {
  return !(a == b);
}

/// A learning-rate schedule with a step counter, checkpointable as JSON.
///
/// At step t (0-based) the factor is: during warmup `t / warmup_steps` (so step 0 trains with
/// lr 0, as HF does); then 1 for constant schedules, and for cosine
/// `m + (1-m)·½(1 + cos(π·min(1, (t-w)/max(1, T-w))))` with m = min_lr_ratio. `lr()` is
/// `base_lr` times that factor. The worker reads `lr()` for the coming optimizer step, then
/// calls `advance()`.
class lr_schedule {
public:
  /// Validates `config` (see `lr_schedule_config::validate`).
  explicit lr_schedule(lr_schedule_config config);

  /// The learning rate of the current step.
  double lr() const { return lr_at(step_); }

  /// The learning rate at step `step` (≥ 0; negative steps give the step-0 rate).
  double lr_at(int64_t step) const;

  /// Moves to the next step.
  void advance() { ++step_; }

  /// Steps taken so far.
  int64_t step() const { return step_; }

  const lr_schedule_config& config() const { return config_; }

  /// `{"kind", "base_lr", "warmup_steps", "total_steps", "min_lr_ratio", "step"}`.
  nlohmann::json to_json() const;

  /// Rebuilds a schedule saved by `to_json`. Throws `error{decode_error}` naming a missing or
  /// ill-typed field or a negative step, and the errors of `lr_schedule_config::validate`.
  static lr_schedule from_json(const nlohmann::json& j);

private:
  lr_schedule_config config_;
  int64_t step_ = 0;
};

} // namespace rlforge::backends
