#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backends/algo/losses.hpp"

/// KL divergence to a reference policy (as an additive loss term or as a reward penalty) and the
/// entropy bonus.
///
/// Estimators of KL(π‖π_ref) per token from Δ = logp - ref (Schulman's approximations):
/// `k1` = Δ; `abs` = |Δ|; `k2` = ½Δ²; `k3` (default): with d = clamp(ref - logp, -20, 20),
/// clamp(exp(d) - d - 1, -10, 10).
///
/// Thread safety: the free functions are reentrant; a `kl_controller` is a plain value owned by
/// one caller (not synchronised).
namespace rlforge::backends::algo {

/// Names of the KL estimators: k1, k2, k3, abs.
const std::vector<std::string>& kl_estimator_names();

/// Per-token KL estimate [B, R] of `logprobs` against `ref_logprobs` (same shape). With a
/// `loss_mask` the result is multiplied by it and is exactly 0 where the mask is 0. Keeps the
/// autograd graph of `logprobs`. Throws `backends::error(invalid_argument)` for an unknown
/// estimator (listing the names), mismatched shapes (naming both) and NaN/inf inputs.
at::Tensor approx_kl(const at::Tensor& logprobs, const at::Tensor& ref_logprobs,
                     const std::string& estimator = "k3", const at::Tensor& loss_mask = {});

/// The KL loss term and its unscaled value.
struct kl_loss_result {
  at::Tensor loss; ///< scalar, coef · kl (differentiable)
  at::Tensor kl;   ///< scalar, mean over ALL B rows of each row's masked mean of the estimate
};

/// `coef` · mean_i( Σ_t m·k / max(Σ_t m, 1) ): the additive KL loss (coef 0.001 by default).
/// With `rows` > 0 the sum over these rows is divided by `rows` instead of their count, so the
/// terms of micro-batches of one pass add up to the pass's mean (the pass has `rows` rows).
/// Throws invalid_argument for NaN/inf or negative `coef`, and as `approx_kl`.
kl_loss_result kl_loss(const at::Tensor& logprobs, const at::Tensor& ref_logprobs,
                       const at::Tensor& loss_mask, const std::string& estimator = "k3",
                       double coef = 0.001, double rows = 0);

/// `coef` · Σ(entropy·m) / max(Σm, 1): subtract it from the loss as an entropy bonus (coef 0.01
/// when enabled). With `tokens` > 0 the sum is divided by `tokens` (the pass's mask weight)
/// instead, so micro-batches add up to the pass's mean. Differentiable when `entropy` is.
/// Throws invalid_argument for a bad coef, shapes or values.
at::Tensor entropy_bonus(const at::Tensor& entropy, const at::Tensor& loss_mask,
                         double coef = 0.01, double tokens = 0);

/// Optional terms added to a policy loss. Both are off by default.
struct regularizer_config {
  bool use_kl_loss = false;
  std::string kl_estimator = "k3";
  double kl_loss_coef = 0.001;
  bool use_entropy_loss = false;
  double entropy_loss_coef = 0.01;
  /// Denominators of the whole pass when the regularizers are applied per micro-batch (0 = the
  /// call's own): its rows (KL: mean over sequences) and its loss-mask weight (entropy: mean
  /// over tokens). Then the micro-batches' terms add up to the pass's, whatever the split.
  double pass_rows = 0;
  double pass_tokens = 0;
};

/// Adds `kl_loss` (needs `in.ref_logprobs` and `in.logprobs`) and subtracts `entropy_bonus`
/// (needs a differentiable `in.entropy`) to `out.loss`, with the incoming `in.loss_mask`
/// (undefined = all ones). Metrics: `kl:mean` (unscaled KL) and `kl_loss:mean` (coef · KL) when
/// the KL term is on; `entropy_loss:mean` (coef · entropy) when the bonus is on. `elementwise`
/// is left unchanged (these are not per-token sums). Throws invalid_argument naming a missing
/// input.
void apply_regularizers(loss_output& out, const loss_inputs& in, const regularizer_config& cfg);

/// Coefficient of the KL-in-reward penalty: fixed, or adapted toward a target KL
/// (Ziegler et al. 2019): coef *= 1 + clip(kl / target - 1, -0.2, 0.2) · n_steps / horizon.
class kl_controller {
public:
  /// A constant coefficient. Throws invalid_argument for NaN/inf.
  static kl_controller fixed(double coef);

  /// Starts at `init_coef`; `target` > 0 (default 0.1), `horizon` > 0 (default 10000). Throws
  /// invalid_argument naming a bad value.
  static kl_controller adaptive(double init_coef, double target = 0.1, int64_t horizon = 10000);

  /// The current coefficient.
  double value() const { return value_; }

  /// True for an adaptive controller.
  bool is_adaptive() const { return adaptive_; }

  /// Feeds the observed KL of `n_steps` samples; a fixed controller ignores it. Throws
  /// invalid_argument for NaN/inf `current_kl` or negative `n_steps`.
  void update(double current_kl, int64_t n_steps);

private:
  kl_controller(double value, bool adaptive, double target, int64_t horizon)
      : value_(value), adaptive_(adaptive), target_(target), horizon_(horizon) {}

  double value_;
  bool adaptive_;
  double target_;
  int64_t horizon_;
};

/// Result of `apply_kl_to_rewards`.
struct kl_reward_result {
  at::Tensor rewards; ///< rewards - coef · kl (kl masked), [B, R]
  double avg_kl;      ///< mean over rows of each row's masked mean KL
  double avg_kl_max;  ///< mean over rows of each row's max |kl| (masked entries are 0)
  double coef;        ///< the coefficient used: max(0, controller value before the update)
};

/// KL in the reward: `rewards -= max(0, coef) · kl` per token with kl = approx_kl(logprobs,
/// ref_logprobs, estimator, loss_mask), then `controller.update(avg_kl, B)` (the batch size is
/// the step count). All tensors [B, R]; throws invalid_argument for mismatched shapes or NaN/inf.
kl_reward_result apply_kl_to_rewards(const at::Tensor& rewards, const at::Tensor& logprobs,
                                     const at::Tensor& ref_logprobs, const at::Tensor& loss_mask,
                                     kl_controller& controller,
                                     const std::string& estimator = "k3");

} // namespace rlforge::backends::algo
