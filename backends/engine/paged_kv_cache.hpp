#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "backends/model/model_config.hpp"

namespace rlforge::backends {

/// The memory of a paged key/value cache: per layer, keys and values in fixed-size blocks,
/// `[kv_heads, num_blocks, block_size, head_dim]` each (head-major, so a run of consecutive
/// block ids is one contiguous `[run * block_size, head_dim]` matrix per head). On the CPU the
/// blocks are fp32; on a CUDA device they are in the model's compute dtype (bf16 for a bf16
/// model: half the memory, and what the fused attention reads). Which block belongs to which
/// sequence is the scheduler's business (scheduler.hpp).
///
/// Thread-safety: none; one owner. Slots not yet written hold undefined values (never read).
class paged_kv_cache {
public:
  /// A cache for `config`'s layers and heads with blocks of `block_size` positions on `device`
  /// in `dtype` (kFloat on the CPU; kFloat or kBFloat16 on a CUDA device); no memory until
  /// `allocate`.
  paged_kv_cache(const model_config& config, int64_t block_size,
                 c10::Device device = c10::Device(c10::kCPU),
                 c10::ScalarType dtype = c10::ScalarType::Float);

  /// Bytes one block takes over all layers, keys and values, with elements of `element_size`
  /// bytes.
  static int64_t block_bytes(const model_config& config, int64_t block_size,
                             int64_t element_size = 4);

  const c10::Device& device() const { return device_; }
  c10::ScalarType dtype() const { return dtype_; }

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

  /// Base of layer `layer`'s keys / values (`[kv_heads, num_blocks, block_size, head_dim]`; a
  /// CPU cache only).
  float* keys(int64_t layer) { return keys_[static_cast<size_t>(layer)].data_ptr<float>(); }
  float* values(int64_t layer) { return values_[static_cast<size_t>(layer)].data_ptr<float>(); }

  /// Layer `layer`'s keys / values as tensors (any device).
  const at::Tensor& key_blocks(int64_t layer) const { return keys_[static_cast<size_t>(layer)]; }
  const at::Tensor& value_blocks(int64_t layer) const {
    return values_[static_cast<size_t>(layer)];
  }

  /// Copies block `src` onto block `dst` in every layer and head (copy-on-write).
  void copy_block(int32_t src, int32_t dst);

  /// Writes keys and values `[N, kv_heads, head_dim]` (contiguous fp32) of layer `layer` into
  /// slots `slots[t]` = block * block_size + offset, one per row.
  void write(int64_t layer, const at::Tensor& k, const at::Tensor& v,
             const std::vector<int64_t>& slots);

  /// `write` for a cache on a CUDA device: `slots` is an int64 tensor on that device; `k` and
  /// `v` may be in any float dtype (converted to the cache's).
  void write(int64_t layer, const at::Tensor& k, const at::Tensor& v, const at::Tensor& slots);

private:
  int64_t layers_, kv_heads_, head_dim_, block_size_;
  c10::Device device_;
  c10::ScalarType dtype_;
  int64_t num_blocks_ = 0;
  std::vector<at::Tensor> keys_, values_;
};

} // namespace rlforge::backends
