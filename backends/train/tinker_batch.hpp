#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "backends/train/training_batch.hpp"
#include "tinker/types.hpp"

/// Tinker datums to the trainer's batch and the trainer's per-row outputs back to per-datum
/// tensors: the one conversion of the Tinker request path (REFERENCE.md "Training batch layout").
/// The datums must be those of a `tinker::checked_request`; nothing is checked again here.
namespace rlforge::backends {

/// Builds one batch from checked datums, row i = datum i. For N input tokens the sequence is
/// `input + [target[N-1]]` (prompt `input[0]`, response the N positions after it), the response
/// tensors are right-aligned to R = the longest N, and `target_tokens` holds the N targets, so
/// column j is scored on the datum's own target (which need not be the shifted input). Loss inputs:
/// `weights` → `loss_mask` (ones when absent), `logprobs` → `action_log_probs` and
/// `rollout_logprobs`, `advantages` / `values` / `returns` as given; an input some datums carry
/// and others do not is 0 for the others (their loss, which needs it, was checked to have it).
/// `metric_mask` (the positions the loss's `:mean` metrics such as `importance_ratio:mean`
/// average over) comes from the datum's structure, never from its advantages' values: a datum
/// with `weights` marks the positions of nonzero weight; one without marks the positions of a
/// nonzero behaviour log-prob (Tinker's RL datums carry 0 at prompt positions), or every position
/// when it has no `logprobs`. `uids` are the datum indices.
training_batch batch_from_datums(const std::vector<const tinker::datum*>& data);

/// The last `lengths[i]` columns of row i of each `[B, R]` output in `outputs` (named as the
/// Tinker outputs: `logprobs`, `values`, `elementwise_loss`), as float32 tensor data: one map per
/// row, in order. Rows beyond `lengths.size()` (padding) are ignored.
std::vector<std::map<std::string, tinker::tensor_data>>
datum_outputs(const std::map<std::string, at::Tensor>& outputs,
              const std::vector<int64_t>& lengths);

} // namespace rlforge::backends
