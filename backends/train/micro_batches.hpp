#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "backends/train/training_batch.hpp"

namespace rlforge::backends {

/// One micro-batch of a worker pass: which rows of the pass's batch it holds (`rows`, in the
/// order they appear in `batch`) and those rows as a batch of their own.
struct micro_batch {
  std::vector<int64_t> rows;
  training_batch batch;
};

/// How a pass splits its batch into micro-batches.
struct micro_batch_limits {
  /// > 0: padding-free packing. Rows are sorted by sequence length (longest first; ties keep
  /// their order) and packed greedily so that rows × the micro-batch's longest sequence stays
  /// within this many tokens (a row longer than the budget goes alone); every micro-batch is
  /// trimmed to its own longest sequence (left padding) and longest response (response columns),
  /// so short rows no longer pay for the batch's longest. As veRL's dynamic batch size.
  int64_t max_tokens = 0;
  /// > 0 and no `max_tokens`: consecutive micro-batches of this many rows, untrimmed.
  int64_t max_rows = 0;
};

/// Splits `batch` (a valid batch, training_batch::validate) per `limits`; without limits, one
/// micro-batch of the whole batch. Every row appears in exactly one micro-batch. Micro-batch
/// rows keep the batch's ids; `pad_size` counts the padding rows it holds (which then need not
/// be its last rows: their loss mask is 0 anyway). Throws `error{invalid_argument}` for
/// negative limits.
std::vector<micro_batch> plan_micro_batches(const training_batch& batch,
                                            const micro_batch_limits& limits);

/// Puts per-micro-batch response outputs (`outputs[i]` is `[rows of micro-batch i, its R_i]`,
/// right-aligned like its batch's response columns) back into one `[B, R]` tensor of the
/// original row order, right-aligned, zeros in the columns a shorter micro-batch lacked. Throws
/// `error{invalid_argument}` when counts or shapes disagree.
at::Tensor scatter_response_outputs(const std::vector<micro_batch>& plan,
                                    const std::vector<at::Tensor>& outputs, int64_t rows,
                                    int64_t response_length);

} // namespace rlforge::backends
