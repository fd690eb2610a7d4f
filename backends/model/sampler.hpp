#pragma once

#include <cstdint>
#include <vector>

#include "backends/model/sampling_params.hpp"

namespace rlforge::backends {

class causal_lm;

/// How `generate` runs the model; the sampled tokens do not depend on it.
struct generate_options {
  /// Prefill once into a key/value cache, then feed one token per step. Off: run the whole
  /// growing sequence through the model at every step (the baseline the benchmark compares to).
  bool use_kv_cache = true;
};

/// Batched generation: `params[i]` applies to `prompts[i]`; returns one result per prompt in
/// the same order.
///
/// Prompts are left-padded to a common length and prefilled in one forward pass; then every
/// step feeds each active row its last token, and rows that finish (stop token, stop string or
/// length) are dropped from the batch and the cache. Each row keeps its own parameters and its own random
/// generator: a row with `seed` draws from a generator seeded with it, a row without from one
/// seeded from a process-wide counter. A sampling row draws exactly one uniform number per
/// generated token (inverse-CDF over token ids), so with the same seed a sequence gets the same
/// tokens whatever else is in the batch. Greedy rows draw nothing.
///
/// A row generates at most `max_tokens` tokens, and never more than fit in the model's context:
/// prompt + generated tokens <= max_position_embeddings (reaching either gives stop_reason
/// "length"). A sampled stop token is kept as the last token (stop_reason "stop"); so is the
/// token after which the row's decoded text contains one of its `stop_strings` (its own
/// `stop_string_matcher`, backends/model/stop_strings.hpp), and the row leaves the batch there.
///
/// Throws `backends::error`: `invalid_argument` when prompts and params differ in count, for an
/// empty prompt, a prompt that fills the whole context, or invalid params (`validate`);
/// `out_of_range` for a prompt token outside the vocabulary. Messages name the request index
/// and the bad value. Runs without autograd. Thread-safety: the model is used by the caller's
/// thread only; concurrent calls need distinct models.
std::vector<sample_result> generate(causal_lm& model,
                                    const std::vector<std::vector<int64_t>>& prompts,
                                    const std::vector<sampling_params>& params,
                                    const generate_options& options = {});

} // namespace rlforge::backends
