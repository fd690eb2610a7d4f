#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <caf/expected.hpp>

#include "runtime/tensor_blob.hpp"

namespace rlforge::actors {

/// The torch scalar type of a wire dtype: f32 -> Float, f64 -> Double, f16 -> Half,
/// bf16 -> BFloat16, i64 -> Long, i32 -> Int, i16 -> Short, i8 -> Char, u8 -> Byte,
/// bool -> Bool. Fails with `errc::invalid_argument` for a value outside the enumeration.
caf::expected<c10::ScalarType> to_scalar_type(dtype x);

/// The wire dtype of a torch scalar type (inverse of `to_scalar_type`). Fails with
/// `errc::unsupported` naming the type for every other one (complex, quantized, float8, ...).
caf::expected<dtype> to_dtype(c10::ScalarType x);

/// Copies `t` into a blob: same dtype and shape, elements in row-major order. Works for any
/// strided tensor (transposed, sliced, expanded) on any device and with or without
/// `requires_grad`; the blob never aliases the tensor. Fails with `errc::invalid_argument` for an
/// undefined tensor, `errc::unsupported` for a dtype without a wire dtype or a non-strided layout
/// (sparse, mkldnn), and `errc::backend_error` when torch itself fails (e.g. copying from a
/// device). Never throws. Cost: one copy (two when `t` is not contiguous or not on the CPU).
caf::expected<tensor_blob> to_blob(const at::Tensor& t);

/// Builds a new CPU tensor that owns a copy of the blob's data, with the blob's dtype and shape
/// (a 0-d tensor for an empty shape). Fails with `errc::invalid_argument` naming the problem
/// when `validate(x)` does, and `errc::backend_error` when torch cannot allocate. Never throws.
caf::expected<at::Tensor> from_blob(const tensor_blob& x);

} // namespace rlforge::actors
