#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Storage.h>

#include <unordered_map>

namespace rlforge::backends {

/// Copies tensors to one device with one new storage per distinct source storage, so tensors
/// sharing a storage (tied weights, views) share one storage in the copies too, with the same
/// offsets, sizes and strides. Copies from a CUDA device to the CPU land in pinned host memory
/// (the fast path back, as offload and sleep use it); on the CPU (virtual GPUs) they are plain,
/// separately allocated copies. One copier per batch of related tensors; not thread-safe.
class storage_copier {
public:
  explicit storage_copier(c10::Device to) : to_(to) {}

  /// The copy of `t` on the target device (no autograd history).
  at::Tensor operator()(const at::Tensor& t);

private:
  c10::Device to_;
  std::unordered_map<const void*, c10::Storage> copies_;
};

} // namespace rlforge::backends
