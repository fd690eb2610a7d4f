#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

/// Advantage estimators, one registry keyed by name. Inputs are token-level rewards [B, R]
/// (outcome rewards usually sit on the last response token), the response mask [B, R], one
/// group id per row (rows sampled from the same prompt share an id; they need not be adjacent)
/// and, for `gae`, the critic's values [B, R]. Outputs are fp32 [B, R].
///
/// With s_i = Σ_t rewards[i, t] (the whole row, as the reference sums it) and, per group g of
/// size n, μ_g = mean of s and σ_g = unbiased std of s:
/// - `grpo` (default): A_i = (s_i - μ_g) / (σ_g + ε) with std normalisation, else s_i - μ_g.
///   A single-sample group uses μ = 0, σ = 1, so A = s / (1 + ε) (normalised) or s.
/// - `rloo`: A_i = (s_i - μ_g) · n / (n - 1) (s minus the mean of the others); n = 1 gives 0.
/// - `maxrl`: A_i = (s_i - μ_g) / (μ_g + ε) for n > 1; a single-sample group gives A = s.
///   These three broadcast A_i over the row times the response mask; returns = advantages.
/// - `reinforce++`: G_t = r_t + γ·G_{t+1} computed right to left, where the running return is
///   reset (multiplied by the mask) after position t is stored, so the last valid token of a
///   right-padded row starts a fresh return; returns = G (unwhitened), advantages =
///   masked_whiten(G) · mask.
/// - `gae`: δ_t = r_t + γ·V_{t+1} - V_t (V_R = 0), A_t = δ_t + γλ·A_{t+1}, over all R positions
///   as given (the caller zeroes rewards and values of padding); returns = A + V (before
///   whitening); advantages = masked_whiten(A) (not multiplied by the mask, as the reference).
/// masked_whiten: (x - μ)·rsqrt(σ² + 1e-8) with the masked mean and unbiased masked variance.
namespace rlforge::backends::algo {

/// Inputs of an estimator; undefined / empty members are absent.
struct advantage_inputs {
  at::Tensor rewards;             ///< [B, R] token-level rewards
  at::Tensor response_mask;       ///< [B, R] 0/1
  std::vector<int64_t> group_ids; ///< [B], for grpo, rloo, maxrl
  at::Tensor values;              ///< [B, R], for gae
};

/// Estimator settings.
struct advantage_config {
  double gamma = 1.0;      ///< discount, in [0, 1]
  double lambd = 1.0;      ///< GAE λ, in [0, 1]
  bool norm_by_std = true; ///< grpo: divide by the group std (false = Dr. GRPO)
  double epsilon = 1e-6;   ///< grpo / maxrl denominator guard, > 0
};

/// Advantages and returns, both [B, R].
struct advantage_output {
  at::Tensor advantages;
  at::Tensor returns;
};

/// Names of the estimators, default first: grpo, rloo, reinforce++, gae, maxrl.
const std::vector<std::string>& advantage_estimator_names();

/// Runs estimator `name`. Throws `backends::error(invalid_argument)` for an unknown name
/// (listing the names), a missing input (naming it and the estimator), tensors that are not 2-D
/// or differ in shape (naming both shapes), NaN/inf inputs (naming the tensor), a group-id count
/// different from B, gamma/lambd outside [0, 1] or non-finite epsilon ≤ 0 (naming the value),
/// fewer than 2 valid tokens for the whitening estimators, and a maxrl group whose μ + ε is 0.
advantage_output compute_advantages(const std::string& name, const advantage_inputs& in,
                                    const advantage_config& cfg = {});

/// Group ids from a 1-D integer tensor. Throws invalid_argument for another dtype or rank.
std::vector<int64_t> group_ids_from_tensor(const at::Tensor& ids);

} // namespace rlforge::backends::algo
