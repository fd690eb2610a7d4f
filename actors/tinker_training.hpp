#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <caf/actor.hpp>

#include "actors/tinker_groups.hpp"
#include "actors/tinker_models.hpp"
#include "tinker/datum_check.hpp"
#include "tinker/types.hpp"

/// Training calls of the Tinker backend (dispatcher_backend.hpp) on one locked model.
namespace rlforge::actors {

/// Runs consecutive `forward_backward` (or `forward`, all `forward_only`) requests of model `m`,
/// which the caller holds locked. Every request is checked first (`tinker::check_request`: its
/// loss resolved for the model's role, its datums against `limits`), so a refused batch changes
/// no gradient. Then each checked request is computed on its own, in order, as one call of the
/// workers' `tinker_forward_backward` (or `tinker_forward`), which trust it: its result does not
/// depend on which other requests arrived with it. The worker computes the loss for `forward`
/// exactly as for `forward_backward`.
///
/// Outputs per datum: `logprobs` (policy) or `values` (critic), and `elementwise_loss`, float32
/// of the datum's length. Metrics: the loss's (`name:reduction`, combined over the pieces);
/// `loss:sum` is the sum of the request's elementwise losses. Throws `tinker::request_error`
/// (user for bad input, naming request, datum, input and position; server for runtime failures).
std::vector<tinker::forward_backward_output>
tinker_forward_backward(tinker_groups& groups, const caf::actor& dispatcher, tinker_model& m,
                        const tinker::model_limits& limits,
                        const std::vector<tinker::forward_backward_request>& batch);

/// One AdamW step of model `m` (locked by the caller) with `p`; metrics `grad_norm:mean`,
/// `learning_rate:mean`, `skipped:max`, `clipped:max`, `step:max`. Bad hyper-parameters are a
/// user error naming the value.
std::map<std::string, double> tinker_optim_step(tinker_groups& groups, const caf::actor& dispatcher,
                                                tinker_model& m, const tinker::adam_params& p);

} // namespace rlforge::actors
