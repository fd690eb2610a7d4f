#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tinker/types.hpp"

namespace rlforge::backends {

/// Named parameters as `causal_lm::named_parameters()` returns them (live leaf tensors).
using named_parameters = std::vector<std::pair<std::string, at::Tensor>>;

/// AdamW hyper-parameters for one optimizer step: the one struct of them (tinker/types.hpp).
using adam_params = tinker::adam_params;

/// Throws `error{invalid_argument}` naming the field and value for: a NaN or infinite field,
/// learning_rate < 0, beta1/beta2 outside [0, 1), eps ≤ 0, weight_decay < 0,
/// grad_clip_norm < 0.
void validate(const adam_params& p);

/// What one `adamw::step` did.
struct step_result {
  double grad_norm = 0.0; ///< global L2 norm of the gradients before clipping
  bool skipped = false;   ///< the norm was NaN/inf: no parameter or state changed
  bool clipped = false;   ///< gradients were scaled down to `grad_clip_norm`
};

/// Per-parameter AdamW state.
struct adamw_param_state {
  at::Tensor exp_avg;    ///< first moment, fp32, parameter-shaped
  at::Tensor exp_avg_sq; ///< second moment, fp32, parameter-shaped
  int64_t step = 0;      ///< updates applied to this parameter
};

/// The whole optimizer state, keyed by parameter name (for checkpoints).
struct adamw_state {
  std::map<std::string, adamw_param_state> params;
  /// Hyper-parameters of the last applied step (defaults before the first one).
  adam_params last_params;
};

/// Checks a saved state: moments defined, fp32 and of equal shape, step counts ≥ 0, valid
/// `last_params`. Throws `error{invalid_argument}` naming the parameter and the problem.
void validate(const adamw_state& s);

/// AdamW with decoupled weight decay and bias correction (Loshchilov & Hutter), written out
/// with in-place fp32 ATen ops so every hyper-parameter may change from one call to the next:
///
///   p ← p·(1 − lr·wd);  m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²;
///   p ← p − lr/(1−β1^t) · m / (√v / √(1−β2^t) + eps)
///
/// with t the parameter's own step count. Parameters are identified by name; a parameter
/// without a gradient is left alone (its state does not advance).
///
/// Thread-safety: none; one owner (a worker) drives it.
class adamw {
public:
  /// Computes the global gradient norm over `params` (those with a gradient), skips the update
  /// when it is not finite, clips to `hp.grad_clip_norm` when > 0 (gradients scaled in place by
  /// `clip / (norm + 1e-6)` when that is < 1, as torch's clip_grad_norm_), then updates every
  /// parameter with a gradient. Throws `error{invalid_argument}` (nothing changed) for bad
  /// hyper-parameters, an undefined, non-fp32 or duplicate-named parameter, a gradient whose
  /// shape differs from its parameter, or a name whose stored state has another shape.
  step_result step(const named_parameters& params, const adam_params& hp);

  /// The state of one parameter, or nullptr before its first update.
  const adamw_param_state* state_of(const std::string& name) const;

  /// A deep copy of the whole state.
  adamw_state state() const;

  /// Replaces the state with a deep copy of `s` after `validate(s)` (nothing changes when it
  /// throws).
  void load_state(const adamw_state& s);

  /// Moves the whole state out without copying its tensors and leaves the optimizer empty, as
  /// after `reset` (for offloading: the caller copies the tensors off the device and drops
  /// these; `put_state` brings the state back).
  adamw_state take_state();

  /// Replaces the state with `s` after `validate(s)`, adopting its tensors without copying them
  /// (the optimizer updates them in place from now on). Nothing changes when it throws.
  void put_state(adamw_state s);

  /// Hyper-parameters of the last applied step.
  const adam_params& last_params() const { return last_params_; }

  /// Forgets all state.
  void reset();

private:
  std::map<std::string, adamw_param_state> state_;
  adam_params last_params_;
};

/// The global L2 norm of the gradients of `params` (parameters without a gradient count as 0):
/// per-tensor norms in the gradients' precision, combined in double.
double global_grad_norm(const named_parameters& params);

/// Clears gradients: drops them (`set_to_none`, the default) or fills them with zeros.
void zero_grad(const named_parameters& params, bool set_to_none = true);

} // namespace rlforge::backends
