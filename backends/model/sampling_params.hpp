#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/model/detokenizer.hpp"

namespace rlforge::backends {

/// Per-request sampling parameters (REFERENCE.md "Sampling").
///
/// Order of operations on a row of logits: divide by `temperature`, keep the `top_k` most likely
/// tokens, then keep the smallest most-likely prefix of those whose renormalised probability
/// reaches `top_p`, renormalise, draw one token. `temperature == 0` is greedy decoding (argmax;
/// `top_k` and `top_p` are then ignored).
struct sampling_params {
  int64_t max_tokens = 0;       ///< required, >= 1: most tokens to generate
  double temperature = 1.0;     ///< >= 0; 0 = greedy
  int64_t top_k = -1;           ///< -1 = off, else >= 1 (values >= vocab size keep everything)
  double top_p = 1.0;           ///< in (0, 1]; 1 = off
  std::optional<uint64_t> seed; ///< a seeded row draws from its own generator
  std::vector<int64_t> stop_token_ids; ///< sampling one of these ends the row (stop_reason "stop")
  /// Non-empty strings; the row ends (stop_reason "stop") with the token after which the decoded
  /// text of the generated tokens contains one of them (backends/model/stop_strings.hpp says
  /// exactly how the text is seen). That token is kept; the text is never cut inside a token.
  std::vector<std::string> stop_strings;
  /// The model's tokenizer, which decodes the generated tokens for `stop_strings`; required when
  /// there are any, unused otherwise. Copies share the loaded tokenizer.
  std::shared_ptr<const detokenizer> tokenizer;
  bool prompt_logprobs = false; ///< also report log p(prompt[i] | prompt[<i])
  /// > 0: also report the k most likely tokens at each prompt position i >= 1, with their
  /// log-probs (0 = off; at most the vocabulary size).
  int64_t topk_prompt_logprobs = 0;
};

/// What one request produced.
struct sample_result {
  /// Generated token ids. A sampled stop token, or the token that completed a stop string, is
  /// included as the last entry.
  std::vector<int64_t> tokens;
  /// Per generated token: its log-probability under the distribution it was actually drawn from,
  /// i.e. the temperature-scaled softmax restricted to the top-k/top-p set and renormalised. For
  /// greedy rows (temperature 0): log_softmax(logits) of the argmax at temperature 1.
  std::vector<double> logprobs;
  /// "stop" when a stop token was sampled or a stop string completed, "length" when max_tokens
  /// (or the model's context length) was reached.
  std::string stop_reason;
  /// When requested: n-1 entries for a prompt of n tokens, entry i-1 = log p(prompt[i] |
  /// prompt[<i]) under the raw model distribution (temperature 1, no filtering).
  std::vector<double> prompt_logprobs;
  /// When `topk_prompt_logprobs` = k > 0: (n-1) x k row-major, row i-1 the k most likely tokens
  /// at prompt position i (most likely first, ties by lower id) and their log-probs under the raw
  /// model distribution.
  std::vector<int64_t> topk_prompt_ids;
  std::vector<double> topk_prompt_logprobs;
};

/// The seed of sample `sample_index` of a request seeded with `seed`: a splitmix64 mix of both,
/// so that distinct (seed, index) pairs give unrelated generator streams (sample j of seed S and
/// sample j-1 of seed S+1 share nothing) and a sample's stream depends only on the pair.
uint64_t sample_seed(uint64_t seed, uint64_t sample_index) noexcept;

/// Throws `backends::error(invalid_argument)` naming the field and value when `p` is not a
/// valid request for a model with `vocab_size` tokens: max_tokens <= 0, temperature negative or
/// not finite, top_k == 0 or < -1, top_p not in (0, 1], a stop token id outside [0, vocab_size),
/// an empty stop string, stop strings without a tokenizer, topk_prompt_logprobs outside
/// [0, vocab_size].
void validate(const sampling_params& p, int64_t vocab_size);

/// Filters a row of normalised log-probabilities in place to the top-k / top-p set and
/// renormalises it; tokens outside the set become -inf. `top_k == -1` and `top_p == 1` are off.
/// Ties are broken by token id: among equally likely tokens the lower id ranks first, so exactly
/// `top_k` tokens survive top-k and the top-p prefix is unique. Top-p sees the probabilities as
/// renormalised after top-k and keeps the shortest prefix whose cumulative probability is >= p.
void filter_log_probs(double* log_probs, int64_t vocab_size, int64_t top_k, double top_p);

/// The full distribution a non-greedy row samples from, as log-probabilities over the
/// vocabulary (-inf outside the kept set): log_softmax(logits / temperature) then
/// `filter_log_probs`. Needs temperature > 0. Throws on NaN logits or an empty row.
std::vector<double> sampling_log_probs(const std::vector<float>& logits, const sampling_params& p);

/// Inverse-CDF draw: the first token id (in id order) whose cumulative probability exceeds
/// `u * total`, where `probs` need not sum exactly to 1. `u` in [0, 1). Zero-probability tokens
/// are never chosen.
int64_t inverse_cdf(const double* probs, int64_t vocab_size, double u);

/// Greedy choice: the lowest token id among the maximal logits.
int64_t greedy_token(const double* values, int64_t vocab_size);

} // namespace rlforge::backends
