#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "backends/engine/paged_kv_cache.hpp"
#include "backends/model/causal_lm.hpp"

namespace rlforge::backends {

/// What one sequence feeds in a forward pass, for the attention over the paged cache.
struct attention_item {
  int64_t token = 0;  ///< index of its first new token in the flattened batch
  int64_t first = 0;  ///< position of that token (positions [0, first) are in the cache)
  int64_t count = 0;  ///< new tokens: positions [first, first + count)
  const std::vector<int32_t>* blocks = nullptr; ///< block table covering [0, first + count)
  /// Items with the same group (e.g. the samples of one prompt) may share leading blocks; their
  /// shared keys are multiplied once for all of their queries.
  uint64_t group = 0;
};

/// Attention over a `paged_kv_cache` for one forward pass of `causal_lm::forward_tokens`.
///
/// Per layer: the new keys/values are written into their slots, then each token attends to its
/// sequence's positions up to itself. Work is split by (item group, kv head): the blocks that
/// every item of a group shares (its prompt, fully in the past) are multiplied once with all the
/// group's queries stacked (cascade attention: the prompt's keys are read once for n samples,
/// not n times), each item's own blocks with its own queries; a joint softmax combines both.
/// Runs of consecutive blocks are one matrix product. Scores are fp32 with one exp pass over
/// the whole step (ATen's vectorised exp); the attention scale is already in the queries.
///
/// On a CUDA device (the cache's) the same attention runs as one fused scaled-dot-product call
/// per layer over every item: each item's cached positions are gathered from its blocks into a
/// padded `[items, kv heads, longest, d]` batch with a causal-and-length mask (the cascade split
/// is a CPU optimisation; the GPU reads the shared prompt blocks once per item).
///
/// The items' block tables must stay unchanged while the object is used. Thread-safety: none;
/// it parallelises internally (ATen's intra-op threads).
class paged_attention final : public attention_hook {
public:
  paged_attention(paged_kv_cache& cache, int64_t heads, std::vector<attention_item> items);

  at::Tensor attend(int64_t layer, const at::Tensor& q, const at::Tensor& k,
                    const at::Tensor& v) override;

  /// Tokens in the pass (sum of the items' counts).
  int64_t tokens() const { return tokens_; }

private:
  struct task {
    std::vector<size_t> items;
    int64_t shared_blocks = 0;    ///< leading blocks common to every item, fully in the past
    int64_t rows = 0;             ///< query rows per kv head: sum of count * group size
    std::vector<int64_t> row_of;  ///< first query row of each item
    std::vector<int64_t> tail_at; ///< offset of each item's own score block (per head)
    int64_t size = 0;             ///< score floats per kv head
    int64_t offset = 0;           ///< start of head 0's scores in the step's buffer
  };

  void scores_pass(int64_t layer, const task& t, int64_t h, const float* q, float* buffer);
  void values_pass(int64_t layer, const task& t, int64_t h, float* buffer, float* out);

  /// The CUDA path's index tensors, built once per pass (see the class comment).
  void plan_device();
  at::Tensor attend_on_device(int64_t layer, const at::Tensor& q, const at::Tensor& k,
                              const at::Tensor& v);

  paged_kv_cache& cache_;
  int64_t heads_, kv_heads_, group_, head_dim_, block_size_;
  std::vector<attention_item> items_;
  std::vector<task> tasks_;
  std::vector<int64_t> slots_;
  int64_t tokens_ = 0;
  at::Tensor scores_; ///< the step's score buffer, reused by every layer
  // The CUDA path: slots written, cache rows gathered per item ([items * longest]), query rows
  // per item ([items * queries]), the mask [items, 1, queries, longest] and, per token, its row
  // in the padded output.
  at::Tensor slot_index_, gather_index_, query_index_, mask_, output_rows_;
  int64_t longest_ = 0, queries_ = 0;
};

} // namespace rlforge::backends
