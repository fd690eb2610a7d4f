#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace rlforge::backends {

/// Names of the tensors a `training_batch` may hold.
namespace batch_keys {
/// `[B, S]` int64: prompt + response token ids, LEFT-padded.
inline constexpr const char* sequences = "sequences";
/// `[B, S]` int64: 1 = real token, 0 = left padding.
inline constexpr const char* attention_mask = "attention_mask";
/// `[B, R]` int64, optional: the token each response position is scored on. When absent a
/// position is scored on the sequence's next token (column j on `sequences[:, S-R+j]`); a Tinker
/// datum's targets need not be its shifted inputs, so its batch carries them (tinker_batch.hpp).
inline constexpr const char* target_tokens = "target_tokens";
/// `[B, R]` float32: 0/1 per response token (0 = ignored by the loss; padding rows are all 0).
inline constexpr const char* loss_mask = "loss_mask";
/// `[B, R]` int64: 1 = a real response token, 0 = the left filler of a shorter response.
inline constexpr const char* response_mask = "response_mask";
/// `[B, R]` float32: log-probs of the policy that produced the data ("old").
inline constexpr const char* action_log_probs = "action_log_probs";
/// `[B, R]` float32: log-probs reported by the inference engine.
inline constexpr const char* rollout_logprobs = "rollout_logprobs";
/// `[B, R]` float32: log-probs of the reference policy.
inline constexpr const char* base_action_log_probs = "base_action_log_probs";
/// `[B, R]` float32 per-token tensors of the RL algorithms.
inline constexpr const char* advantages = "advantages";
inline constexpr const char* values = "values";
inline constexpr const char* returns = "returns";
inline constexpr const char* rewards = "rewards";
/// `[B, R]` float32, optional: nonzero at the positions a loss's `:mean` metrics average over
/// (see losses.hpp, "Metric tokens"). A Tinker datum without `weights` marks the positions that
/// carry a behaviour log-prob (tinker_batch.hpp). Absent: the loss mask's nonzero positions.
inline constexpr const char* metric_mask = "metric_mask";
} // namespace batch_keys

/// The float32 `[B, R]` tensors that are optional (every response tensor but the two masks).
const std::vector<std::string>& optional_response_keys();

/// Every `[B, R]` key: the two masks, `target_tokens`, then `optional_response_keys()`.
const std::vector<std::string>& response_keys();

/// What `training_batch::validate` checks beyond the layout.
struct batch_checks {
  /// When > 0, every id in `sequences` must lie in `[0, vocab_size)`.
  int64_t vocab_size = -1;
  /// When true, `loss_mask` may hold any finite weight (Tinker `weights`, which SDK 0.25's
  /// `forward_backward_custom` makes negative: -dLoss/dlogprob) instead of 0/1.
  bool weighted_loss_mask = false;
};

/// One batch of training rows in the layout of REFERENCE.md ("Training batch layout").
///
/// Row i holds `prompt_i + response_i`, left-padded to S = max_i(len_i) in `sequences`. Response
/// tensors are `[B, R]` with R = `response_length` = max response length, RIGHT-aligned: column j
/// belongs to sequence position `S - R + j`, so `logits[:, -R-1:-1]` (positions S-R-1 .. S-2)
/// predict exactly the response tokens. Padding rows (added by `pad_to_multiple`) are the last
/// `pad_size` rows. `uids` / `group_ids` are per-row ids (empty, or one per row).
///
/// Plain data: copying a batch shares the tensors (as `at::Tensor` does).
struct training_batch {
  std::map<std::string, at::Tensor> tensors; ///< name → tensor, first dimension B
  int64_t response_length = 0;               ///< R
  int64_t pad_size = 0;                      ///< number of trailing padding rows
  std::vector<int64_t> uids;                 ///< per-row sample ids (or empty)
  std::vector<int64_t> group_ids;            ///< per-row prompt-group ids (or empty)

  /// B: rows of `sequences` (0 when absent).
  int64_t batch_size() const;

  /// S: columns of `sequences` (0 when absent).
  int64_t sequence_length() const;

  /// True when a tensor named `key` is present.
  bool has(const std::string& key) const;

  /// The tensor named `key`; throws `error{not_found}` naming it and the keys present.
  const at::Tensor& get(const std::string& key) const;

  /// Checks the layout and the values: `sequences`, `attention_mask`, `loss_mask` and
  /// `response_mask` present; B ≥ 1, 1 ≤ R ≤ S - 1; dtypes as documented in `batch_keys`; every
  /// tensor has B rows, every response tensor exactly R columns; masks 0/1 (see `batch_checks`);
  /// response tokens are real tokens (`response_mask` = 1 implies `attention_mask` = 1) and
  /// `loss_mask` is 0 where `response_mask` is 0; token ids inside the vocabulary when given; no
  /// NaN/inf in float tensors; ids of `sequences` and `target_tokens` ≥ 0; 0 ≤ pad_size ≤ B (a
  /// shard may be all padding); ids empty or one per row. Throws `error{invalid_argument}`
  /// (`out_of_range` for a token id) naming the tensor, the expected and actual shape or the bad
  /// value and its position.
  void validate(const batch_checks& checks = {}) const;

  /// The same batch with every tensor on `device` (ids and counts copied; tensors already
  /// there are shared, not copied).
  training_batch to(const c10::Device& device) const;
};

/// The response-aligned `[B, R]` columns of a per-position tensor `[B, S-1, ...]` whose column p
/// belongs to the prediction of token p+1 (e.g. `sequence_logprobs(...).logprobs`): its last R
/// columns, i.e. `logits[:, -R-1:-1]` applied. Column j then lines up with the batch's response
/// tensors. Throws `error{invalid_argument}` when `per_position` has fewer than two dimensions or
/// fewer than R columns, or R < 1.
at::Tensor response_columns(const at::Tensor& per_position, int64_t response_length);

/// Optional per-token values for `from_sequences`, keyed by a response tensor name
/// (`loss_mask` or one of `optional_response_keys()`); row i has exactly |response_i| values.
using per_token_values = std::map<std::string, std::vector<std::vector<float>>>;

/// Builds a batch from token id lists. Row i is `prompts[i] + responses[i]` left-padded with
/// `pad_token_id`; `response_mask` marks the response tokens; `loss_mask` defaults to 1 on them;
/// other response tensors come from `per_token` (right-aligned, 0 in the filler). `uids` are
/// 0..B-1. Throws `error{invalid_argument}` for an empty batch, mismatched list sizes, an empty
/// prompt (nothing would predict the first response token), all responses empty, an unknown
/// key or a row whose value count differs from its response length, naming row and key.
training_batch from_sequences(const std::vector<std::vector<int64_t>>& prompts,
                              const std::vector<std::vector<int64_t>>& responses,
                              const per_token_values& per_token = {}, int64_t pad_token_id = 0);

/// Appends copies of real rows (cycling through them in order) with `loss_mask` (and
/// `metric_mask`) = 0 until the row count is a multiple of `multiple`; `pad_size` grows by the
/// rows added. Throws
/// `error{invalid_argument}` for `multiple` < 1 or a batch without real rows.
training_batch pad_to_multiple(const training_batch& batch, int64_t multiple);

/// Rows `[begin, end)` as a batch of their own (tensors are views; ids sliced; `pad_size` counts
/// the padding rows inside the range). Throws `error{invalid_argument}` for a bad range.
training_batch slice_rows(const training_batch& batch, int64_t begin, int64_t end);

/// Splits into `n` equal chunks, in order (chunk i goes to DP rank i). Throws
/// `error{invalid_argument}` when `n` < 1 or B is not a multiple of `n` (pad first).
std::vector<training_batch> shard(const training_batch& batch, int64_t n);

/// Concatenates batches row-wise, in order. They must share key set, S, R and whether they
/// carry ids; padding rows may only come last overall. Throws `error{invalid_argument}` naming
/// the first batch index that disagrees.
training_batch concat(const std::vector<training_batch>& batches);

/// Drops the last `pad_size` rows of a per-row output `[B, ...]`. Throws
/// `error{invalid_argument}` when the output has no dimensions or `pad_size` is outside
/// `[0, B]`.
at::Tensor trim_padding(const at::Tensor& output, int64_t pad_size);

/// `trim_padding` applied to every tensor of a map of per-row outputs (naming the bad one).
std::map<std::string, at::Tensor> trim_padding(const std::map<std::string, at::Tensor>& outputs,
                                               int64_t pad_size);

/// The batch without its padding rows (`pad_size` becomes 0).
training_batch trim_padding(const training_batch& batch);

} // namespace rlforge::backends
