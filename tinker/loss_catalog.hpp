#pragma once

#include <map>
#include <string>
#include <vector>

/// The losses a Tinker `forward_backward` / `forward` may name, in ONE table: their
/// `loss_fn_config` keys, defaults and domains, the `loss_fn_inputs` each needs, and how each maps
/// onto the trainer's loss registry (backends/algo/losses.hpp, which owns the math). The service,
/// the backend and the workers all use this table; nothing else lists Tinker losses.
///
/// | loss_fn | model | registry loss | config keys (Tinker defaults) | inputs besides target_tokens
/// |
/// |---|---|---|---|---|
/// | cross_entropy | policy | cross_entropy | — | — |
/// | importance_sampling | policy | importance_sampling | — | logprobs, advantages |
/// | ppo | policy | regular: eps_clip_low = 1 - clip_low_threshold, eps_clip_high =
/// clip_high_threshold - 1 | clip_low_threshold (0.8), clip_high_threshold (1.2), value_clip
/// (ignored) | logprobs, advantages | | ppo | critic | ppo_critic | value_clip (0.2; inf = off),
/// thresholds ignored | values, returns | | ppo_critic | critic | ppo_critic | value_clip | values,
/// returns | | gspo | policy | gspo (thresholds as ppo) | clip_low_threshold, clip_high_threshold |
/// logprobs, advantages | | cispo | policy | cispo: cispo_eps_clip_low = 1 - low,
/// cispo_eps_clip_high = high - 1 | clip_low_threshold (0.0), clip_high_threshold (4.0) | logprobs,
/// advantages | | dppo | policy | dppo | delta_low (0.2), delta_high (0.2) | logprobs, advantages |
/// | dro | policy | dro | beta (required) | logprobs, advantages |
///
/// Domains: clip_low_threshold ∈ [0, 1]; clip_high_threshold finite and ≥ 1; value_clip ≥ 0
/// (inf disables clipping); delta_* and beta finite and ≥ 0; NaN never.
///
/// Thread safety: everything here is reentrant; the table is immutable.
namespace rlforge::tinker {

/// What a model is trained as.
enum class model_role { policy, critic };

/// "policy" or "critic".
const char* to_string(model_role x) noexcept;

/// A Tinker loss resolved for one model: the registry loss and its settings, and the
/// `loss_fn_inputs` every datum must carry.
struct resolved_loss {
  std::string tinker_name;                    ///< as requested ("ppo", ...)
  std::string name;                           ///< registry name ("regular", ...)
  std::map<std::string, double> values;       ///< registry numeric settings
  std::map<std::string, std::string> options; ///< registry string settings
  std::vector<std::string> required_inputs;   ///< target_tokens first
};

inline bool operator==(const resolved_loss& a, const resolved_loss& b) {
  return a.tinker_name == b.tinker_name && a.name == b.name && a.values == b.values &&
         a.options == b.options && a.required_inputs == b.required_inputs;
}

/// The Tinker loss names accepted, sorted.
const std::vector<std::string>& loss_names();

/// The `loss_fn_config` keys `loss_fn` accepts, sorted. Throws `request_error` (user) for an
/// unknown loss, listing the names.
std::vector<std::string> loss_config_keys(const std::string& loss_fn);

/// The `loss_fn_inputs` names a datum may carry: target_tokens, weights, logprobs, advantages,
/// values, returns.
const std::vector<std::string>& loss_input_names();

/// Resolves `loss_fn` with `config` for a model of `role`. Throws `request_error` (user) naming
/// the loss and the problem: an unknown loss (listing the names), a loss the role cannot train
/// with (a value loss for a policy, a policy loss for a critic), an unknown key (naming it and
/// listing the loss's keys), a NaN or out-of-domain value (naming key and value), a missing
/// `beta` for dro.
resolved_loss resolve_loss(const std::string& loss_fn, const std::map<std::string, double>& config,
                           model_role role);

} // namespace rlforge::tinker
