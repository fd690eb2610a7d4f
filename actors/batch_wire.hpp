#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <caf/expected.hpp>

#include "backends/train/training_batch.hpp"
#include "runtime/messages.hpp"

namespace rlforge::actors {

/// Converts a training batch to its wire form (one copy of every tensor). Fails with
/// `errc::unsupported` for a tensor without a wire dtype and `errc::invalid_argument` for an
/// undefined tensor, naming it.
caf::expected<batch_payload> to_payload(const backends::training_batch& batch);

/// Converts a wire batch back (one copy of every tensor). Only the wire format is checked here
/// (valid blobs, ids); the layout is `training_batch::validate`'s job. Errors name the tensor.
caf::expected<backends::training_batch> from_payload(const batch_payload& payload);

/// Named tensors to blobs and back, naming the tensor that fails.
caf::expected<std::map<std::string, tensor_blob>>
to_blobs(const std::map<std::string, at::Tensor>& tensors);
caf::expected<std::map<std::string, at::Tensor>>
from_blobs(const std::map<std::string, tensor_blob>& blobs);

// -- row operations on payloads (no torch: byte slices of row-major tensors) ------------------

/// The row count B shared by every tensor of `p`. Fails with `errc::invalid_argument` naming a
/// tensor that is invalid, has no dimensions or another row count, ids whose count is neither
/// 0 nor B, or a pad_size outside [0, B]. An empty payload (no tensors) has 0 rows.
caf::expected<int64_t> payload_rows(const batch_payload& p);

/// Rows `[begin, end)` of `p` (pad_size counts the trailing padding rows inside the range).
caf::expected<batch_payload> slice_payload(const batch_payload& p, int64_t begin, int64_t end);

/// Appends copies of real rows, cycling through them in order, with `loss_mask` and `metric_mask`
/// zero, until the row count is a multiple of `multiple` (same rule as
/// `backends::pad_to_multiple`). Fails for
/// `multiple` < 1 and for a payload without real rows (an empty batch).
caf::expected<batch_payload> pad_payload(const batch_payload& p, int64_t multiple);

/// Splits into `n` equal chunks in order (chunk i for data-parallel rank i). Fails unless the
/// row count is a positive multiple of `n`.
caf::expected<std::vector<batch_payload>> shard_payload(const batch_payload& p, int64_t n);

/// Combines metrics named `name:reduction` from several parts (micro-batches or ranks), each
/// with its loss-mask weight: `:sum` adds, `:max` / `:min` take the extreme, `:mean` is the
/// weighted mean (plain mean when all weights are 0); a name without a known suffix is treated
/// as `:mean`.
std::map<std::string, double>
combine_metrics(const std::vector<std::pair<std::map<std::string, double>, double>>& parts);

/// Merges per-rank results in rank order: concatenates every output's rows, drops the last
/// `pad_size` rows, combines metrics (`combine_metrics`) and adds the weights. Every part must
/// hold the same outputs with the same dtypes and trailing shapes (errors name the rank).
caf::expected<batch_result> merge_results(const std::vector<batch_result>& parts,
                                          int64_t pad_size);

} // namespace rlforge::actors
