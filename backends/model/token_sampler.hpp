#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "backends/model/sampling_params.hpp"

namespace rlforge::backends {

/// One sequence's random stream. A sampling (non-greedy) row draws exactly one uniform number
/// per generated token, so the same seed gives the same tokens whatever else is in the batch,
/// and skipping k draws (`skip`) resumes the stream after k tokens.
class row_generator {
public:
  /// Seeded with `seed`, or (none) with a fresh seed from a process-wide counter.
  explicit row_generator(std::optional<uint64_t> seed);

  /// A uniform number in [0, 1) (53 random bits).
  double next_uniform();

private:
  at::Generator generator_;
};

/// A sampled token and its log-probability under the distribution it was drawn from.
struct sampled_token {
  int64_t token = 0;
  double logprob = 0.0;
};

/// Samples one token per row of `logits` (`[A, vocab]`, any float dtype): row k with
/// `*params[k]` from `*generators[k]`, with the semantics of REFERENCE.md "Sampling" and
/// `sampling_params`: temperature, top-k, top-p, inverse-CDF draw (one uniform per sampling
/// row), greedy rows (temperature 0) take the lowest argmax and report log_softmax at
/// temperature 1. Sampling is computed in double; the log-prob reported for a row without
/// top-k/top-p is the trainer's (`tempered_log_softmax` in fp32, logprobs.hpp), so a
/// batch-invariant engine and trainer agree bit for bit. Sizes must agree (checked).
std::vector<sampled_token> sample_tokens(const at::Tensor& logits,
                                         const std::vector<const sampling_params*>& params,
                                         const std::vector<row_generator*>& generators);

/// `log p(tokens[j] | ...)` under the raw model distribution (temperature 1, no filtering) for
/// each row j of `logits` (`[R, vocab]`), computed as the trainer scores targets (fp32
/// `tempered_log_softmax`): prompt log-probabilities.
std::vector<double> token_logprobs(const at::Tensor& logits, const std::vector<int64_t>& tokens);

/// The `k` most likely tokens of each row of `logits` (`[R, vocab]`, k <= vocab) under the raw
/// model distribution, as `token_logprobs` computes it: row-major `R x k` ids and log-probs, most
/// likely first, ties broken by the lower token id.
struct topk_logprobs {
  std::vector<int64_t> ids;
  std::vector<double> logprobs;
};
topk_logprobs top_token_logprobs(const at::Tensor& logits, int64_t k);

} // namespace rlforge::backends
