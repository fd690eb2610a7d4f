#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "backends/model/causal_lm.hpp"

namespace rlforge::backends {

/// fp32 `log_softmax(logits / temperature)` over the last dimension: the one function the
/// trainer's log-probs (`chunked_token_logprobs`) and the sampler's reported log-probs use, so
/// both get the same bits from the same logits (each row is computed independently of the
/// others). `logits` must be fp32.
at::Tensor tempered_log_softmax(const at::Tensor& logits, double temperature);

/// Per-token log-probabilities of given targets and, optionally, the entropy of each position's
/// token distribution.
struct token_logprobs_result {
  at::Tensor logprobs; ///< [B, T] log softmax(logits / temperature)[target]
  at::Tensor entropy;  ///< [B, T] -(p * log p).sum(-1); undefined unless requested
};

/// Log-probs of `targets` (int64 [B, T], ids in [0, vocab)) under `softmax(hidden W^T /
/// temperature)` with `hidden` [B, T, H] and `weight` the lm_head matrix [vocab, H], computed
/// `chunk_size` positions at a time so the [B, T, vocab] logits never exist at once, neither in the
/// forward pass nor in the backward pass (which recomputes each chunk's logits). With an `adapter`
/// (A, B defined) the logits gain its low-rank term `scaling · (h Aᵀ) Bᵀ`. Differentiable with
/// respect to `hidden`, `weight` and the adapter (first order). Throws `backends::error`:
/// `out_of_range` naming a target id outside the vocabulary and the vocabulary size;
/// `invalid_argument` for temperature ≤ 0 or NaN, chunk_size < 1, shapes that disagree, or T >
/// `max_positions` (naming both numbers; -1 = no limit). With `weight_compute` (a bf16 copy of
/// `weight`, mixed precision) the logits' products run in bf16 and the fp32 `weight` receives the
/// gradient; log-softmax, entropy and the results stay fp32.
///
/// When backward will run and all [B·T, vocab] log-probs fit in `keep_bytes` (fp32), forward
/// keeps them and backward reuses them instead of recomputing the logits (a third less of the
/// head's products, where memory is not the concern: small vocabularies or short batches);
/// `keep_bytes` 0 always recomputes. Same results either way.
inline constexpr int64_t default_kept_logprob_bytes = int64_t{256} << 20;
token_logprobs_result chunked_token_logprobs(const at::Tensor& hidden, const at::Tensor& weight,
                                             const at::Tensor& targets, double temperature,
                                             int64_t chunk_size, bool with_entropy,
                                             int64_t max_positions = -1,
                                             const causal_lm::head_adapter& adapter = {},
                                             const at::Tensor& weight_compute = {},
                                             int64_t keep_bytes = default_kept_logprob_bytes);

/// `chunked_token_logprobs` with the model's lm_head (and its adapter, when LoRA targets it) and
/// its max_position_embeddings limit.
token_logprobs_result token_logprobs(causal_lm& model, const at::Tensor& hidden,
                                     const at::Tensor& targets, double temperature = 1.0,
                                     int64_t chunk_size = 128, bool with_entropy = false);

/// One full pass over left-padded `input_ids` [B, S] with `attention_mask` [B, S]: the
/// log-probs of `input_ids[:, 1:]` given their prefixes, [B, S-1] (entries whose target is
/// padding are meaningless and should be masked by the caller). Position ids are the
/// cumulative sum of the mask minus 1, clamped at 0, as the sampler uses.
token_logprobs_result sequence_logprobs(causal_lm& model, const at::Tensor& input_ids,
                                        const at::Tensor& attention_mask, double temperature = 1.0,
                                        int64_t chunk_size = 128, bool with_entropy = false);

/// Scores one unpadded token sequence (no autograd): entry i is
/// log p(tokens[i+1] | tokens[0..i]), so the result has tokens.size() - 1 entries.
/// Throws `backends::error(invalid_argument)` for fewer than two tokens.
std::vector<double> score_tokens(causal_lm& model, const std::vector<int64_t>& tokens,
                                 double temperature = 1.0);

} // namespace rlforge::backends
