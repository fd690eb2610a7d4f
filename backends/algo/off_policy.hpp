#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backends/algo/common.hpp"

/// Off-policy correction between the trainer's "old" policy and the rollout (inference engine)
/// policy. Per token, ρ_t = exp(clamp(old_t - roll_t, -20, 20)); the raw log-ratio
/// `old - roll` (unclamped) is what sequence statistics sum.
///
/// The four mechanisms run in this order, each seeing the mask left by the previous ones:
///  1. outlier sequence mask: a row with ANY valid token (m > 0) whose ρ is strictly below
///     `outlier_token_is_threshold_low` or strictly above `outlier_token_is_threshold_high`
///     gets m = 0 everywhere (either threshold alone enables it);
///  2. token mask: a valid token with ρ outside the closed interval
///     [`token_mask_is_threshold_low`, `token_mask_is_threshold_high`] gets m = 0. Either bound
///     alone enables it; a missing bound is unbounded on that side (a deliberate widening: the
///     reference implementation silently ignores a single bound);
///  3. truncated importance sampling (TIS), a stop-gradient factor on the per-token loss:
///     `token`: min(ρ_t, `token_tis_ratio_clip_high`); `sequence`:
///     min(exp(clamp(Σ_t m·log ρ_t, -20, 20)), `sequence_tis_ratio_clip_high`), the sum taken
///     over the mask after steps 1-2. Neither is clipped from below;
///  4. sequence mask (`sequence_mask_metric`): `geometric` keeps a row when
///     exp(clamp(Σ m·log ρ / max(Σ m, 1), ±20)) lies in [`geo_mask_low`, `geo_mask_high`];
///     `product` when exp(clamp(Σ m·log ρ, ±20)) lies in [`product_mask_low`,
///     `product_mask_high`]; rejected rows get m = 0.
///
/// Metrics (all rates are fractions in [0, 1]):
/// - always when enabled: `is_ratio_mean:mean` = masked mean of ρ over the incoming mask;
///   `is_ratio_std:mean`, `is_ratio_max:max`, `is_ratio_min:min` are the unbiased std / max / min
///   of the elementwise product ρ·m over ALL B·R entries (masked entries count as 0, exactly as
///   the reference implementation reports them; the std is 0 for a single entry);
/// - outlier: `outlier_seq_masked_ratio:mean`, `outlier_seq_over_high_ratio:mean`,
///   `outlier_seq_under_low_ratio:mean` (fractions of the B rows);
/// - token mask: `token_mask_ratio:mean` = tokens masked / max(valid tokens before it, 1);
/// - TIS: `tis_token_clip_high_ratio:mean` = valid tokens with ρ > cap / max(valid tokens, 1),
///   or `tis_seq_clip_high_ratio:mean` = rows with ρ_seq > cap / B;
/// - sequence mask: `{geo,product}_sequence_mask_{masked,over_high,under_low}_ratio:mean`
///   (fractions of the B rows).
namespace rlforge::backends::algo {

/// Parsed off-policy settings. Every mechanism is off by default.
struct off_policy_config {
  std::string tis_ratio_type = "none";                   ///< none | token | sequence
  double token_tis_ratio_clip_high = 2.0;                ///< cap of the token TIS factor
  double sequence_tis_ratio_clip_high = 5.0;             ///< cap of the sequence TIS factor
  std::string sequence_mask_metric = "none";             ///< none | geometric | product
  double geo_mask_low = 0.99;                            ///< geometric mask lower bound
  double geo_mask_high = 1.01;                           ///< geometric mask upper bound
  double product_mask_low = 0.5;                         ///< product mask lower bound
  double product_mask_high = 2.0;                        ///< product mask upper bound
  std::optional<double> outlier_token_is_threshold_low;  ///< e.g. 1e-4; unset = off
  std::optional<double> outlier_token_is_threshold_high; ///< e.g. 100; unset = off
  std::optional<double> token_mask_is_threshold_low;     ///< unset = unbounded below
  std::optional<double> token_mask_is_threshold_high;    ///< unset = unbounded above

  /// True when any mechanism is enabled.
  bool enabled() const;
};

/// The numeric keys `parse_off_policy_config` understands.
const std::vector<std::string>& off_policy_value_keys();

/// The string keys `parse_off_policy_config` understands (`tis_ratio_type`,
/// `sequence_mask_metric`).
const std::vector<std::string>& off_policy_option_keys();

/// Reads the off-policy keys of `cfg` (other keys are ignored: the caller validates the full key
/// set). Throws `backends::error(invalid_argument)` naming the key and value for NaN/inf,
/// non-positive caps and bounds, low > high, or an unknown option value (listing the valid ones).
/// `what` prefixes messages.
off_policy_config parse_off_policy_config(const loss_config& cfg, const std::string& what);

/// Result of the correction: the updated mask, the stop-gradient TIS factor (undefined when TIS
/// is off; [B, R] for `token`, [B, 1] for `sequence`) and the metrics described above.
struct off_policy_result {
  at::Tensor loss_mask;
  at::Tensor tis_ratio;
  std::map<std::string, double> metrics;
};

/// Applies the enabled mechanisms in order to `loss_mask` (float [B, R]). With every mechanism
/// off it returns the mask unchanged and no metrics. `old_logprobs`, `rollout_logprobs` and
/// `loss_mask` must be finite float tensors of one shape [B, R] (checked; invalid_argument).
off_policy_result compute_off_policy_correction(const at::Tensor& old_logprobs,
                                                const at::Tensor& rollout_logprobs,
                                                const at::Tensor& loss_mask,
                                                const off_policy_config& cfg);

} // namespace rlforge::backends::algo
