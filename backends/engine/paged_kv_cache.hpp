#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "backends/model/model_config.hpp"

namespace rlforge::backends {

/// The memory of a paged key/value cache: per layer, keys and values in fixed-size blocks,
/// `[kv_heads, num_blocks, block_size, head_dim]` fp32 each (head-major, so a run of
/// consecutive block ids is one contiguous `[run * block_size, head_dim]` matrix per head).
/// Which block belongs to which sequence is the scheduler's business (scheduler.hpp).
///
/// Thread-safety: none; one owner. Slots not yet written hold undefined values (never read).
class paged_kv_cache {
public:
  /// A cache for `config`'s layers and heads with blocks of `block_size` positions; no memory
  /// until `allocate`.
  paged_kv_cache(const model_config& config, int64_t block_size);

  /// Bytes one block takes over all layers, keys and values.
  static int64_t block_bytes(const model_config& config, int64_t block_size);

  /// (Re)allocates room for `num_blocks` blocks (contents undefined).
  void allocate(int64_t num_blocks);

  /// Frees the memory (`allocated()` becomes false; `num_blocks` is kept for `allocate`).
  void release();

  bool allocated() const { return !keys_.empty(); }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t kv_heads() const { return kv_heads_; }
  int64_t head_dim() const { return head_dim_; }

  /// Bytes held now (0 when released).
  int64_t bytes() const;

  /// Base of layer `layer`'s keys / values (`[kv_heads, num_blocks, block_size, head_dim]`).
  float* keys(int64_t layer) { return keys_[static_cast<size_t>(layer)].data_ptr<float>(); }
  float* values(int64_t layer) { return values_[static_cast<size_t>(layer)].data_ptr<float>(); }

  /// Copies block `src` onto block `dst` in every layer and head (copy-on-write).
  void copy_block(int32_t src, int32_t dst);

  /// Writes keys and values `[N, kv_heads, head_dim]` (contiguous fp32) of layer `layer` into
  /// slots `slots[t]` = block * block_size + offset, one per row.
  void write(int64_t layer, const at::Tensor& k, const at::Tensor& v,
             const std::vector<int64_t>& slots);

private:
  int64_t layers_, kv_heads_, head_dim_, block_size_;
  int64_t num_blocks_ = 0;
  std::vector<at::Tensor> keys_, values_;
};

} // namespace rlforge::backends
