#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>

namespace rlforge::backends {

/// How `attention` computes softmax(q kᵀ + bias) v.
enum class attention_kernel {
  /// Per (row, kv head) GEMMs over the whole key range with the bias added: fast, but a
  /// query's result depends (at fp32 rounding) on how many keys and queries are in the call, so
  /// a token scored during decoding differs slightly from the same token scored in a full
  /// forward pass.
  gemm,
  /// Batch-invariant: each query visits exactly its allowed keys (bias 0), in key order, with
  /// fixed-order dot products, softmax sums and value accumulation, so its result depends only
  /// on its own query and the allowed keys' values and order: bit for bit the same in a
  /// KV-cached decode step, a prefill, and a training forward pass over any batch.
  invariant,
};

/// softmax(q kᵀ + bias) v for every (batch row, kv head), as one autograd node.
/// - q: `[B, KV, G*T, d]` fp32, pre-scaled by 1/sqrt(d); row `g*T + t` is query t of the g-th
///   query head sharing kv head (grouped-query attention);
/// - k, v: `[B, KV, T_total, d]` fp32 (rows may be strided views, e.g. of a KV cache);
/// - bias: `[B, T, T_total]` fp32 additive, 0 (allowed) or -inf (masked), shared by the G query
///   heads of a group; every query row must allow at least one key;
/// - group: G.
/// Returns `[B, KV, G*T, d]`. Backward (for q, k and v) is the same for both kernels (it need
/// not be batch-invariant: only forward values are compared across engines and trainers). The
/// probabilities are kept for backward, as autograd of the unfused ops would keep them.
///
/// On a CUDA device the products run in `compute` (kBFloat16 for a bf16 model) through libtorch's
/// fused scaled-dot-product attention (2.1 and later; batched products before), and the result
/// comes back in q's dtype; with `causal_only` (the bias masks nothing but the future and
/// T == T_total) the bias is not read and the causal kernel runs. `kernel` applies to the CPU,
/// which always computes in fp32 and reads the bias.
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& bias, int64_t group, attention_kernel kernel,
                     bool causal_only = false, c10::ScalarType compute = c10::ScalarType::Float);

} // namespace rlforge::backends
