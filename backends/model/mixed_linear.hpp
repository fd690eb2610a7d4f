#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace rlforge::backends {

/// `x Wᵀ + b` with the product in bf16 and everything around it in fp32 (mixed precision):
/// `x` (fp32, any leading dims, last dim = in) is rounded to bf16, multiplied by `weight_bf16`
/// ([out, in], bf16) with one GEMM that takes the fast bf16 path (no addmm: the bias is added
/// afterwards in fp32), and the result is returned in fp32. `weight` is the fp32 master weight
/// that `weight_bf16` is a copy of (or the same bf16 tensor, for models stored in bf16): it
/// receives the fp32 gradient `gᵀ x` when it requires grad; `x` gets `g W` (both products in
/// bf16). `bias` may be undefined. Saves `x` in bf16 for backward (half the activation memory).
at::Tensor mixed_linear(const at::Tensor& x, const at::Tensor& weight,
                        const at::Tensor& weight_bf16, const at::Tensor& bias);

/// A bf16 copy of an fp32 master tensor, refreshed on use whenever the master changed: its
/// storage or its autograd version counter (bumped by every in-place update: optimizer steps,
/// `copy_`, loads) differ from when the copy was made. A master that is already bf16 is
/// returned as is. Not thread-safe: one owner (the model) uses it.
class bf16_copy {
public:
  /// The copy of `master` (refreshed when stale).
  const at::Tensor& of(const at::Tensor& master);

  /// Drops the copy (e.g. when the model offloads its weights).
  void reset();

  /// Bytes held by the copy (0 when none).
  int64_t bytes() const;

private:
  at::Tensor copy_;
  const void* data_ = nullptr;
  int64_t version_ = -1;
};

} // namespace rlforge::backends
