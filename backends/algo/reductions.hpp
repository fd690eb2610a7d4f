#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

/// Loss reductions, applied per mini-batch by scaling the advantages so that the masked SUM
/// every loss returns equals the wanted mean. With m the loss mask of the mini-batch [B, R]:
/// - `token_mean` (default): A / max(Σ_all m, 1) — every token weighs the same;
/// - `sequence_mean`: A / (B · max(Σ_t m_i, 1)) — the mean over sequences of each one's token
///   mean;
/// - `seq_mean_token_sum_norm` (Dr. GRPO): A / (B · max_seq_len) — a constant normaliser;
/// - `prompt_mean`: A / (P · max(Σ m over the rows of that prompt group, 1)) with P the number
///   of distinct group ids — the mean over prompts of each prompt's token mean. Rows with the
///   same id form a group whether or not they are adjacent.
/// B counts every row, padding rows (all-zero mask) included, as in the reference.
namespace rlforge::backends::algo {

/// Names of the reductions, default first.
const std::vector<std::string>& loss_reduction_names();

/// Returns the scaled advantages (fp32, [B, R]). `group_ids` (one per row) is required for
/// `prompt_mean` and ignored otherwise; `max_seq_len` (> 0) is required for
/// `seq_mean_token_sum_norm` and ignored otherwise. Throws `backends::error(invalid_argument)`
/// for an unknown reduction (listing the names), mismatched shapes (naming both), NaN/inf
/// inputs, negative mask weights, a missing or wrong-length `group_ids`, or `max_seq_len` ≤ 0.
at::Tensor scale_advantages(const at::Tensor& advantages, const at::Tensor& loss_mask,
                            const std::string& reduction = "token_mean",
                            const std::vector<int64_t>& group_ids = {}, int64_t max_seq_len = 0);

} // namespace rlforge::backends::algo
