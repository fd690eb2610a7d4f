#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "backends/algo/common.hpp"
#include "backends/algo/off_policy.hpp"

/// RL policy and value losses, one registry keyed by name.
///
/// Every loss works on per-token tensors [B, R] (response tokens, right-aligned) and returns the
/// MASKED SUM Σ_t m'_t·f_t·ℓ_t of its per-token loss ℓ, where m' is the loss mask after the
/// off-policy correction (the incoming mask when that is off) and f the stop-gradient TIS factor
/// (1 when off). The reduction (token mean, sequence mean, ...) is applied beforehand by scaling
/// the advantages (see reductions.hpp). All math runs in fp32: inputs of other floating dtypes
/// are converted (autograd flows through the conversion of `logprobs` / `values`).
///
/// Per token, r = exp(clamp(logp - old, -20, 20)) and sg(·) is stop-gradient. Losses and their
/// numeric config keys (defaults):
/// - cross_entropy: -logp. No keys.
/// - importance_sampling: -r·A (no clipping). No keys.
/// - regular: -min(r·A, clip(r, 1-εl, 1+εh)·A). eps_clip_low 0.2, eps_clip_high 0.2.
/// - dual_clip: regular, and where A < 0: min(-c·A, ℓ_regular). + clip_ratio_c 3.0 (> 1).
/// - gspo: regular applied to w = exp(min(logp - sg(logp) + sg(s_i), 10)) with the sequence
///   log-ratio s_i = Σ m(logp-old) / max(Σ m, 1). eps_clip_low, eps_clip_high.
/// - sapo: -g·A, g = sigmoid(τ(r-1))·4/τ, τ = τ+ if A > 0 else τ-. tau_pos 1.0, tau_neg 1.05.
/// - cispo: -A·sg(clip(r_b, 1-εl, 1+εh))·logp. cispo_eps_clip_low 1.0, cispo_eps_clip_high 4.0.
/// - rollout_is: -sg(r_roll·1[1-εl < r_roll < 1+εh])·A·logp with r_roll against the rollout
///   log-probs. eps_clip_low, eps_clip_high.
/// - dppo: -r_μ·A·keep with μ = rollout (else old). delta_low 0.2, delta_high 0.2.
/// - clip_cov: max(-A·r, -A·clip(r))·corr. eps_clip_*, clip_ratio 2e-4, clip_cov_lb 1,
///   clip_cov_ub 5, seed 0.
/// - kl_cov: -A·r, plus ppo_kl_coef·|logp - old| on selected tokens. kl_cov_frac 0.2,
///   ppo_kl_coef 1.
/// - dro: -(logp·A - ½β(logp - old)²). beta (required, ≥ 0).
/// - ppo_critic: ½·max((V_c - R)², (V - R)²), V_c = V_old + clamp(V - V_old, ±vc).
///   value_clip 0.2.
///
/// Details and choices:
/// - old log-probs: every loss above that reads `old` (importance_sampling, regular, dual_clip,
///   gspo, sapo, cispo, clip_cov, kl_cov, dro) takes the string option `old_logprobs` = `given`
///   (default: the input `old_logprobs`) or `current`: old = sg(logp), the policy being trained
///   as the one that produced the data. That is the on-policy case of one update per batch (the
///   loop's --epochs 1), where a separate forward of the same weights would compute the same
///   values; with `current` the ratio is exactly 1 and the input `old_logprobs` must be absent.
/// - cispo: the ratio's base b is `old` by default; string option `cispo_anchor` = `rollout`
///   uses the rollout log-probs instead (then TIS must be off: it would correct twice).
/// - dppo: string option `dppo_type` = `binary_tv` (default) zeroes tokens where A > 0 and
///   p - μ_p > δh, or A < 0 and μ_p - p > δl (p = exp(logp), μ_p = exp(μ)); `binary_kl` zeroes
///   them where A > 0, p > μ_p and KL_bin > δh, or A < 0, p < μ_p and KL_bin > δl, with
///   KL_bin = μ_p(μ - logp) + (1-μ_p)·log((1-μ_p+1e-8)/(1-p+1e-8)).
/// - clip_cov (Cui et al. 2025): cov_t = (A_t - Ā)(logp_t - mean logp), means over valid tokens.
///   Candidates are valid tokens not already clipped by PPO (-A·clip(r) > -A·r) with
///   clip_cov_lb < cov < clip_cov_ub; max(⌊clip_ratio·Σm⌋, 1) of them are drawn uniformly at
///   random (a permutation from a CPU generator seeded with `seed`, so the draw is reproducible;
///   when there are no more candidates than that, all are taken) and get corr = 0 (no loss, no
///   gradient). Metric `clip_ratio:mean` is the fraction of valid tokens so dropped.
/// - kl_cov: cov as above over the valid tokens; the ⌊kl_cov_frac·n⌋ (at least 1) tokens with the
///   largest cov (ties broken by the top-k order) get the extra abs-KL penalty. No PPO clip.
/// - ppo_critic: uses `values` (differentiable), `returns` and, when clipping, `old_values`.
///   `value_clip` = inf (or the string option `value_clip` = `none`) disables clipping:
///   ℓ = ½(V-R)². Metric `clipfrac:mean` = masked mean of 1[(V_c-R)² > (V-R)²] (clipping only).
/// - Off-policy correction (off_policy.hpp, keys listed there) applies to regular, dual_clip,
///   gspo, sapo, cispo, rollout_is and dppo only, and only when `rollout_logprobs` is present;
///   it needs `old_logprobs`. For the other losses its keys are unknown keys.
/// - `loss_mask` weights tokens (any finite weight; undefined = all ones). Tinker's `weights` may be
///   negative (SDK 0.25's `forward_backward_custom` sends -dLoss/dlogprob); the RL loop's are 0/1.
///   Masked-out tokens contribute exactly 0 even if their per-token loss is not finite.
///
/// Metrics are named `name:reduction`: always `loss:sum` (= loss); `entropy:mean` when
/// `entropy` is given; `clip_ratio:mean` for every policy loss except cross_entropy and
/// importance_sampling (the clipped indicator: PPO family 1[clip(r)·A < r·A], cispo 1[r outside the
/// clip range], rollout_is 1[r outside the open interval], dppo 1[keep = 0], clip_cov as above,
/// sapo and kl_cov 0); `importance_ratio:mean` for importance_sampling (masked mean of r); for
/// cispo also `cispo_ratio_mean:mean`, `cispo_ratio_clamped_mean:mean`, `cispo_ratio_max:max`,
/// `cispo_ratio_min:min` (over valid tokens); plus the off-policy metrics when it is active.
/// Metric tokens: the `:mean` metrics above (and the cispo extremes) average over the tokens of
/// nonzero loss-mask weight (weighted by |weight|), narrowed to the nonzero positions of
/// `metric_mask` when that is given (a Tinker datum's sampled positions: tinker_batch.hpp). They
/// never depend on the advantages' values: the same batch with all-zero advantages reports the
/// same ratios. When `metric_mask` leaves no token, the loss mask alone selects them.
/// `loss_output::metric_weight` is their total weight.
///
/// Thread safety: every function here is reentrant; the registry is immutable after its
/// first use (built under C++ static-initialisation guarantees).
namespace rlforge::backends::algo {

/// Per-token inputs, all [B, R]; an undefined tensor means "absent".
struct loss_inputs {
  at::Tensor logprobs;         ///< current policy log-probs (autograd)
  at::Tensor old_logprobs;     ///< log-probs of the policy that produced the data
  at::Tensor rollout_logprobs; ///< log-probs reported by the inference engine
  at::Tensor advantages;       ///< per-token advantages (already reduction-scaled)
  at::Tensor loss_mask;        ///< float weights, 0/1 normally; undefined = all ones
  at::Tensor values;           ///< critic values (autograd), ppo_critic
  at::Tensor old_values;       ///< critic values when the data was produced, ppo_critic
  at::Tensor returns;          ///< critic targets, ppo_critic
  at::Tensor ref_logprobs;     ///< reference-policy log-probs (KL, see kl.hpp)
  at::Tensor entropy;          ///< per-token entropy, for the `entropy:mean` metric
  at::Tensor metric_mask;      ///< nonzero = a position the `:mean` metrics average over
};

/// A loss's result.
struct loss_output {
  at::Tensor loss;        ///< scalar fp32: Σ m'·f·ℓ, differentiable
  at::Tensor elementwise; ///< [B, R] m'·f·ℓ, detached (sums to `loss`)
  at::Tensor loss_mask;   ///< [B, R] the mask m' actually applied (after off-policy masking)
  std::map<std::string, double> metrics; ///< `name:reduction` → value
  /// The weight of the `:mean` metrics when parts are combined: the loss-mask weight of the tokens
  /// they average over (see the header comment on metric tokens).
  double metric_weight = 0;
};

/// Names of the policy losses, in registry order.
const std::vector<std::string>& policy_loss_names();

/// Names of the value losses (`ppo_critic`).
const std::vector<std::string>& value_loss_names();

/// True for a value loss name.
bool is_value_loss(const std::string& name);

/// True for any registered loss name.
bool is_loss_name(const std::string& name);

/// Numeric config keys `name` accepts (including off-policy keys where they apply), sorted.
/// Throws invalid_argument for an unknown loss, listing the registered ones.
std::vector<std::string> loss_value_keys(const std::string& name);

/// String option keys `name` accepts, sorted. Throws like `loss_value_keys`.
std::vector<std::string> loss_option_keys(const std::string& name);

/// Checks `cfg` for loss `name` without computing anything. Throws
/// `backends::error(invalid_argument)`: unknown loss (listing the names), unknown key (naming
/// it and listing the valid keys), a value out of domain (naming key and value), a missing
/// required key (`beta` for dro).
void validate_loss_config(const std::string& name, const loss_config& cfg);

/// Everything `compute_loss` would refuse, checked without computing: the config errors of
/// `validate_loss_config`, a missing required input, shapes, non-floating or non-finite inputs.
void check_loss_inputs(const std::string& name, const loss_inputs& in,
                       const loss_config& cfg = {});

/// Computes loss `name` on `in` with `cfg`. Besides the config errors of
/// `validate_loss_config`, throws invalid_argument for a missing required input (naming the
/// input and the loss), tensors that are not 2-D or whose shapes differ (naming both shapes),
/// NaN or inf in an input (naming the tensor) and negative loss-mask weights.
loss_output compute_loss(const std::string& name, const loss_inputs& in,
                         const loss_config& cfg = {});

/// A loss and its config, validated once (`check_loss`). A training pass checks its request
/// once, its loss with `check_loss` and its whole batch's inputs with `check_request_inputs`,
/// then computes each micro-batch (a slice of that batch) with `compute_loss(checked, in)`,
/// which checks nothing again. Immutable; safe to share between threads.
class checked_loss {
public:
  const std::string& name() const { return name_; }
  const loss_config& config() const { return cfg_; }

private:
  friend checked_loss check_loss(const std::string& name, const loss_config& cfg);
  friend checked_loss accept_checked_loss(const std::string& name, const loss_config& cfg);
  friend struct checked_loss_access; // losses.cpp
  checked_loss(std::string name, loss_config cfg, off_policy_config off_policy)
      : name_(std::move(name)), cfg_(std::move(cfg)), off_policy_(std::move(off_policy)) {}
  std::string name_;
  loss_config cfg_;
  off_policy_config off_policy_; ///< parsed from cfg_
};

/// `name` with `cfg`, validated: throws as `validate_loss_config`.
checked_loss check_loss(const std::string& name, const loss_config& cfg = {});

/// `name` with `cfg` as another layer already checked them: a Tinker loss resolved by the loss
/// catalog (tinker/loss_catalog.hpp), whose keys and domains are the registry's. Parsed, not
/// checked again. Only a bug in rlforge can pass an unchecked one; builds without NDEBUG check
/// it anyway and throw `internal` for that.
checked_loss accept_checked_loss(const std::string& name, const loss_config& cfg);

/// The inputs of a request before the model computed its outputs (`in` without `logprobs`,
/// `values` and `entropy`): every input `loss` needs is given, and every given one is a finite
/// floating-point [B, R] tensor shaped like the loss mask (which must be given). Throws
/// invalid_argument as `compute_loss` would. This is the whole check of a training request's
/// inputs; its micro-batches are computed without checking again.
void check_request_inputs(const checked_loss& loss, const loss_inputs& in);

/// Computes `loss` on `in`, whose inputs were checked with the request they came from
/// (`check_request_inputs`), without checking them again. Only a bug in rlforge can pass
/// unchecked inputs; builds without NDEBUG check them anyway and throw `internal` for that.
loss_output compute_loss(const checked_loss& loss, const loss_inputs& in);

} // namespace rlforge::backends::algo
