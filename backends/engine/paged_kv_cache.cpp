#include "backends/engine/paged_kv_cache.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstring>
#include <string>

#include "backends/error.hpp"

namespace rlforge::backends {

paged_kv_cache::paged_kv_cache(const model_config& config, int64_t block_size,
                               c10::Device device, c10::ScalarType dtype)
    : layers_(config.num_hidden_layers), kv_heads_(config.num_key_value_heads),
      head_dim_(config.head_dim), block_size_(block_size), device_(device), dtype_(dtype) {
  if (block_size < 1)
    fail(error_code::invalid_argument,
         "paged_kv_cache: block_size must be >= 1, got " + std::to_string(block_size));
  if (dtype != at::kFloat && (device.is_cpu() || dtype != at::kBFloat16))
    fail(error_code::invalid_argument, std::string("paged_kv_cache: ") + c10::toString(dtype) +
                                           " blocks on " + device.str() +
                                           " (fp32 anywhere, bf16 on a CUDA device)");
}

int64_t paged_kv_cache::block_bytes(const model_config& config, int64_t block_size,
                                    int64_t element_size) {
  return 2 * config.num_hidden_layers * config.num_key_value_heads * block_size *
         config.head_dim * element_size;
}

void paged_kv_cache::allocate(int64_t num_blocks) {
  if (num_blocks < 0)
    fail(error_code::invalid_argument,
         "paged_kv_cache: num_blocks must be >= 0, got " + std::to_string(num_blocks));
  release();
  num_blocks_ = num_blocks;
  for (int64_t l = 0; l < layers_; ++l) {
    const auto on = at::TensorOptions().dtype(dtype_).device(device_);
    keys_.push_back(at::empty({kv_heads_, num_blocks, block_size_, head_dim_}, on));
    values_.push_back(at::empty({kv_heads_, num_blocks, block_size_, head_dim_}, on));
  }
}

void paged_kv_cache::release() {
  keys_.clear();
  values_.clear();
}

int64_t paged_kv_cache::bytes() const {
  int64_t n = 0;
  for (auto& t : keys_)
    n += static_cast<int64_t>(t.nbytes());
  for (auto& t : values_)
    n += static_cast<int64_t>(t.nbytes());
  return n;
}

void paged_kv_cache::copy_block(int32_t src, int32_t dst) {
  if (!allocated())
    fail(error_code::internal, "paged_kv_cache::copy_block: the cache is released");
  if (!device_.is_cpu()) {
    for (auto* blocks : {&keys_, &values_})
      for (auto& t : *blocks)
        t.select(1, dst).copy_(t.select(1, src));
    return;
  }
  const int64_t block = block_size_ * head_dim_;
  for (int64_t l = 0; l < layers_; ++l)
    for (float* base : {keys(l), values(l)})
      for (int64_t h = 0; h < kv_heads_; ++h) {
        float* head = base + h * num_blocks_ * block;
        std::memcpy(head + dst * block, head + src * block, sizeof(float) * block);
      }
}

void paged_kv_cache::write(int64_t layer, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& slots) {
  const int64_t n = slots.numel();
  if (!allocated() || k.dim() != 3 || k.size(0) != n || k.size(1) != kv_heads_ ||
      k.size(2) != head_dim_ || v.sizes() != k.sizes() || slots.device() != device_)
    fail(error_code::internal, "paged_kv_cache::write: keys/values do not match the cache");
  // [kv, num_blocks * block_size, d] views of the blocks; slot s is row s of each head.
  const int64_t rows = num_blocks_ * block_size_;
  auto& kd = keys_[static_cast<size_t>(layer)];
  auto& vd = values_[static_cast<size_t>(layer)];
  kd.view({kv_heads_, rows, head_dim_}).index_copy_(1, slots, k.to(dtype_).transpose(0, 1));
  vd.view({kv_heads_, rows, head_dim_}).index_copy_(1, slots, v.to(dtype_).transpose(0, 1));
}

void paged_kv_cache::write(int64_t layer, const at::Tensor& k, const at::Tensor& v,
                           const std::vector<int64_t>& slots) {
  const auto n = static_cast<int64_t>(slots.size());
  if (!allocated() || k.dim() != 3 || k.size(0) != n || k.size(1) != kv_heads_ ||
      k.size(2) != head_dim_ || !k.is_contiguous() || !v.is_contiguous() ||
      v.sizes() != k.sizes() || k.scalar_type() != at::kFloat || v.scalar_type() != at::kFloat)
    fail(error_code::internal, "paged_kv_cache::write: keys/values do not match the cache");
  const float* ks = k.data_ptr<float>();
  const float* vs = v.data_ptr<float>();
  float* kd = keys(layer);
  float* vd = values(layer);
  const int64_t head_stride = num_blocks_ * block_size_ * head_dim_;
  const size_t row = sizeof(float) * static_cast<size_t>(head_dim_);
  at::parallel_for(0, n, 256, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t h = 0; h < kv_heads_; ++h) {
        const int64_t dst = h * head_stride + slots[static_cast<size_t>(t)] * head_dim_;
        const int64_t src = (t * kv_heads_ + h) * head_dim_;
        std::memcpy(kd + dst, ks + src, row);
        std::memcpy(vd + dst, vs + src, row);
      }
  });
}

} // namespace rlforge::backends
