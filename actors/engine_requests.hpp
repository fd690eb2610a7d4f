#pragma once

#include <optional>
#include <string>
#include <vector>

#include "backends/engine/continuous_engine.hpp"
#include "runtime/messages.hpp"

namespace rlforge::actors {

class engine_weights;

/// The tokenizer an engine rank decodes generated tokens with for stop strings, or why it has
/// none. Owned by the rank; immutable between two `init_model`s.
struct engine_tokenizer {
  std::shared_ptr<const backends::detokenizer> tokenizer;
  /// When `tokenizer` is empty: why, naming the directory ("'DIR' has none (...)", "cannot load
  /// the tokenizer of 'DIR': ...").
  std::string missing;
};

/// Checks every request of a call before any of it runs and converts it for the continuous
/// engine: one backend request per `sample_request`, its `num_samples` samples seeded with
/// `sample_seed(seed, first_sample + j)` (so they share one prefill), keyed by the weights it
/// runs on: 0 (`weight_version` 0) = the live weights, following updates; v >= 1 = exactly
/// version v (current or retained), also after newer weights arrive. Throws `backends::error`
/// naming `op`, the request index and the bad value: an empty list, weight_version < 0,
/// num_samples < 1, first_sample < 0, an empty stop string, stop strings when `tok` has no
/// tokenizer ("stop strings need the model's tokenizer; " + `tok.missing`), anything
/// `continuous_engine::check` refuses, and (`not_found`) a version the engine does not hold.
/// Requests with stop strings get `tok`'s tokenizer.
std::vector<backends::engine_request> check_requests(const std::vector<sample_request>& requests,
                                                     const backends::continuous_engine& engine,
                                                     const engine_weights& weights,
                                                     const engine_tokenizer& tok,
                                                     const std::string& op);

/// The rows of a finished (or stopped) request, one per sample; each carries the prompt
/// log-probabilities when they were asked for.
std::vector<sample_output> to_outputs(backends::engine_output&& out);

} // namespace rlforge::actors
