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

/// Padded tokens (rows × longest row) one worker call of `tinker_forward_backward` holds at most:
/// a request with more is computed in consecutive pieces of whole datums (the losses are sums,
/// so the pieces add up to the request's loss and gradient).
inline constexpr int64_t tinker_tokens_per_call = 65536;

/// Runs consecutive `forward_backward` (or `forward`, all `forward_only`) requests of model `m`,
/// which the caller holds locked: every request is resolved against the loss catalog for the
/// model's role and checked against `limits` first (`tinker::check_datums`), so a refused batch
/// changes no gradient; then each request is computed on its own, in order, as one or more worker
/// calls of whole datums (at most `tinker_tokens_per_call` padded tokens each), so its result
/// does not depend on which other requests arrived with it. The worker computes the loss for
/// `forward` exactly as for `forward_backward`.
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
